package middleware

import (
	"context"
	"log/slog"
	"time"
)

// OutboundEvent is what the outbound transport (adapters/outbound) did
// with an outgoing request, or learnt from the upstream's answer
// (Observer.Outbound). These events are the transport's own, so an
// Observer tells them from the events of incoming requests by their
// method; the decisions of a Limiter that decides outgoing requests are
// reported to Decided as any others (give such a Limiter its own
// Observer, or metrics with their own labels, to tell them apart).
type OutboundEvent struct {
	// Kind is what happened.
	Kind OutboundKind
	// Rule is the rule of the binding limit of the request: the one it
	// waited for, or was refused, paused or lowered under.
	Rule string
	// Duration is, for OutboundWaited and OutboundGaveUp, how long the
	// request waited; for OutboundPaused, how long the pause lasts.
	Duration time.Duration
	// Status is, for OutboundRefused, the upstream's status.
	Status int
	// Units is, for OutboundLowered, how many units were taken off the
	// budget to follow the upstream's count; for OutboundLearned and
	// OutboundCut, the learned limit (of the budget's first limit) after
	// the event, in units per its window.
	Units int
	// Limit is, for OutboundLearned and OutboundCut, the limit in force
	// that the learned one lowers (the rule's, or the client's override).
	Limit int
	// Unit is, for OutboundLearned and OutboundCut, what the budget
	// counts: "requests", or a rule's Usage.Unit ("tokens").
	Unit string
}

// OutboundKind is the kind of an OutboundEvent.
type OutboundKind uint8

// The kinds of OutboundEvent.
const (
	// OutboundWaited: a request waited for its turn (Duration), then was
	// sent.
	OutboundWaited OutboundKind = iota + 1
	// OutboundGaveUp: a request could not fit within its context's
	// deadline or the transport's maximum wait, and was not sent; Duration
	// is how long it waited first.
	OutboundGaveUp
	// OutboundRefused: the upstream refused a request the limiter had
	// admitted (429 Too Many Requests, or 503 with Retry-After).
	OutboundRefused
	// OutboundPaused: the upstream asked to wait (Retry-After, or none of
	// a budget left until its reset) and the transport paused the
	// request's keys for Duration (Limiter.Pause).
	OutboundPaused
	// OutboundLowered: the upstream reported fewer units left than the
	// limiter's budget held, and Units were taken off the budget to match.
	OutboundLowered
	// OutboundLearned: the limit learned of the upstream for a key
	// (Limiter.Learn) changed: it is Units per window now, against the
	// Limit in force. Reported by the process that heard of the change
	// (the fleet's fraction is read by each process: each reports it).
	OutboundLearned
	// OutboundCut: a refusal of the upstream was counted as evidence that
	// the budget was too generous, and cut the fleet's learned fraction
	// (one process reports each cut): the learned limit is Units now.
	OutboundCut
)

var outboundNames = [...]string{
	OutboundWaited:  "waited",
	OutboundGaveUp:  "gave_up",
	OutboundRefused: "refused",
	OutboundPaused:  "paused",
	OutboundLowered: "lowered",
	OutboundLearned: "learned",
	OutboundCut:     "cut",
}

// String returns the kind's name as metrics label it: "waited",
// "gave_up", "refused", "paused", "lowered", "learned" or "cut".
func (k OutboundKind) String() string {
	if int(k) < len(outboundNames) && outboundNames[k] != "" {
		return outboundNames[k]
	}
	return "unknown"
}

// ReportOutbound tells the Limiter's Observers about e (Observer.Outbound).
// The outbound transport calls it; it does nothing on a Limiter without
// Observers.
func (l *Limiter) ReportOutbound(e OutboundEvent) {
	if o := l.cfg.obs; o != nil {
		o.Outbound(e)
	}
}

// Outbound logs, at Info, pauses and cuts of a learned limit (at most
// once a second per rule, with how many were not logged), and at Warn
// requests refused by an upstream (likewise).
func (o *LogObserver) Outbound(e OutboundEvent) {
	ctx := context.Background()
	switch e.Kind {
	case OutboundPaused:
		if n, ok := o.errs.allow("outbound-paused:" + e.Rule); ok {
			o.log.LogAttrs(ctx, slog.LevelInfo, "sluice: upstream asked to wait: outgoing requests paused",
				slog.String("rule", e.Rule), slog.Duration("pause", e.Duration), slog.Int("not_logged", n))
		}
	case OutboundCut:
		if n, ok := o.errs.allow("outbound-cut:" + e.Rule); ok {
			o.log.LogAttrs(ctx, slog.LevelInfo, "sluice: upstream refused a request the budget had room for: learned limit cut",
				slog.String("rule", e.Rule), slog.String("unit", e.Unit), slog.Int("limit", e.Units), slog.Int("of", e.Limit), slog.Int("not_logged", n))
		}
	case OutboundRefused:
		if n, ok := o.errs.allow("outbound-refused:" + e.Rule); ok {
			o.log.LogAttrs(ctx, slog.LevelWarn, "sluice: upstream refused an outgoing request",
				slog.String("rule", e.Rule), slog.Int("status", e.Status), slog.Int("not_logged", n))
		}
	}
}
