// Package usage keeps the account of a request whose cost is known only
// once it has run (an LLM's tokens, a query's cost, bytes sent, seconds of
// work): what its usage limits charged it when it was admitted, what it
// reports it used, once, and what is left to charge or to give back when
// it ends. It holds no counter: the store charges what a Ledger says is
// due, through the store's own Settle (a charge that cannot be refused)
// and Refund.
//
// # The life of a request
//
// A request is admitted with an estimate on each of its usage limits: the
// rule's estimate, clamped to its Max and at least 1, or 1 when the
// estimate did not fit but the budget was not spent (Line.Paid). While it
// runs, it may report its usage once (Ledger.Settle): the units it used in
// all, its estimate included, at most Max. When it ends (Ledger.Close)
// each line is due the difference between what it used (its estimate, if
// it reported nothing) and what it paid; a usage reported after the end,
// such as a body streamed once the handler returned, is due at once. A
// difference above zero is charged whatever the counter holds, which may
// take it past its limit (a debt, see package window); one below zero is
// given back.
//
// # The bound
//
// A usage limit admits a request only while the client's budget is not
// spent, and each admitted request is charged in all at most Max, so a
// client gets, within one window of the limit, at most
//
//	limit + in-flight × Max
//
// units, where in-flight is how many of its requests were admitted before
// their usage was known: each such request found the count below the
// limit and added at most Max to it. With the estimate charged up front,
// the excess is in fact at most in-flight × (Max − estimate) plus one
// estimate.
//
// Package middleware keeps the public face (Rule.Usage, Settle,
// Result.Settle, the usage header, read with ParseUnits) and the stores
// their charging (window.Settle and its Lua twin); docs/usage.md describes
// usage limits for users, with the debts of each algorithm and the bound.
package usage

import (
	"errors"
	"fmt"
	"sync"
)

// The errors of Settle and ParseUnits; package middleware exports them.
var (
	// ErrTwice: the request already reported its usage.
	ErrTwice = errors.New("sluice: settle: the request's usage was already settled")
	// ErrBad: the usage is negative, above the rule's max, or not a
	// number.
	ErrBad = errors.New("sluice: settle: bad usage")
)

// Line is one usage limit an admitted request was charged on.
type Line struct {
	// Estimate is what the request owes if it reports nothing: its
	// estimate, clamped to [1, Max].
	Estimate int64
	// Paid is what the request has been charged so far: Estimate at
	// admission, or 1 when its estimate did not fit a budget that was not
	// spent; then what each settle brought it to.
	Paid int64
	// Max is the most the request may be charged on this line.
	Max int64
	// Rule names the line's rule, for errors.
	Rule string
}

// Ledger is the account of one admitted request on its usage limits. It
// is safe for concurrent use: a handler may settle on its own goroutine
// while the front end ends the request.
type Ledger struct {
	mu      sync.Mutex
	lines   []Line
	units   int64
	settled bool // Settle succeeded
	closed  bool // Close ran
}

// NewLedger returns the account of a request charged on lines.
func NewLedger(lines []Line) *Ledger { return &Ledger{lines: lines} }

// Settle records that the request used units in all on each of its
// lines. It returns an error, and records nothing, if units is negative
// or above a line's Max (ErrBad) or if the request already settled
// (ErrTwice). If the request has already ended (Close ran), the
// differences are due at once: due holds them, one per line (see Close);
// otherwise due is nil and Close returns them.
func (l *Ledger) Settle(units int64) (due []int64, err error) {
	if units < 0 {
		return nil, fmt.Errorf("%w: %d units is negative", ErrBad, units)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled {
		return nil, ErrTwice
	}
	for _, ln := range l.lines {
		if units > ln.Max {
			return nil, fmt.Errorf("%w: %d units is more than rule %q admits for one request (its max, %d)", ErrBad, units, ln.Rule, ln.Max)
		}
	}
	l.units, l.settled = units, true
	if !l.closed {
		return nil, nil
	}
	return l.due(), nil
}

// Close ends the request: it returns what is due on each line, the units
// used (or the estimate, if the request settled nothing) less what was
// paid, and counts it as paid. A later Settle is due at once.
func (l *Ledger) Close() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.due()
}

// due returns what each line is due and counts it paid; l.mu is held.
func (l *Ledger) due() []int64 {
	d := make([]int64, len(l.lines))
	for i := range l.lines {
		ln := &l.lines[i]
		used := ln.Estimate
		if l.settled {
			used = l.units
		}
		d[i], ln.Paid = used-ln.Paid, used
	}
	return d
}

// Used reports what the request used on line i: what it settled, or its
// estimate if it settled nothing.
func (l *Ledger) Used(i int) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled {
		return l.units
	}
	return l.lines[i].Estimate
}

// MaxUnits is the largest usage ParseUnits accepts: 2^50, the largest
// Requests of a limit.
const MaxUnits = 1 << 50

// ParseUnits parses a usage reported in a response header or trailer,
// which may come from an upstream that is not trusted: a decimal number
// of units, digits only, with optional spaces or tabs around it, at most
// MaxUnits. Anything else (a sign, a fraction, an exponent, a list) is
// ErrBad.
func ParseUnits(s string) (int64, error) {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t') {
		j--
	}
	if i == j {
		return 0, fmt.Errorf("%w: empty", ErrBad)
	}
	var n int64
	for k := i; k < j; k++ {
		c := s[k]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q is not a number of units", ErrBad, clip(s))
		}
		if n = n*10 + int64(c-'0'); n > MaxUnits {
			return 0, fmt.Errorf("%w: %q is more than %d units", ErrBad, clip(s), int64(MaxUnits))
		}
	}
	return n, nil
}

// clip shortens a hostile value for an error message.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
