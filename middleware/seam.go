package middleware

import (
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

// The public Limit, Charge, Decision and Slot are declared here, where
// users read them, and the arithmetic that every store shares lives in
// internal/window over that package's own types of the same layout: the
// same fields, in the same order, of the same sizes, and the same values
// for Algorithm and Period. Converting between them is therefore free: a
// pointer, or a slice header, is read as the other type, and nothing is
// copied on the way to the store. TestSeamLayout checks, field by field,
// that the two sides still agree; a field added to one side only fails it.
//
// Decision and Slot have the same underlying types as window's and convert
// with ordinary conversions; Limit and Charge differ only in the named
// types of Algorithm and Period (uint8 on both sides).

// internal returns l as internal/window's Limit.
func (l *Limit) internal() *window.Limit { return (*window.Limit)(unsafe.Pointer(l)) }

// internalCharges returns cs as internal/window's Charges, sharing their
// memory.
func internalCharges(cs []Charge) []window.Charge {
	return unsafe.Slice((*window.Charge)(unsafe.Pointer(unsafe.SliceData(cs))), len(cs))
}

// internalDecisions returns ds as internal/window's Decisions, sharing
// their memory.
func internalDecisions(ds []Decision) []window.Decision {
	return unsafe.Slice((*window.Decision)(unsafe.Pointer(unsafe.SliceData(ds))), len(ds))
}

// internalSlots returns ss as pointers to internal/window's Slots.
func internalSlots(ss []*Slot) []*window.Slot {
	return unsafe.Slice((**window.Slot)(unsafe.Pointer(unsafe.SliceData(ss))), len(ss))
}

// internalLimits returns ls as internal/window's Limits, sharing their
// memory.
func internalLimits(ls []Limit) []window.Limit {
	return unsafe.Slice((*window.Limit)(unsafe.Pointer(unsafe.SliceData(ls))), len(ls))
}

// publicLimits returns ls as Limits, sharing their memory.
func publicLimits(ls []window.Limit) []Limit {
	return unsafe.Slice((*Limit)(unsafe.Pointer(unsafe.SliceData(ls))), len(ls))
}
