package middleware

// FailurePolicy returns the limiter's failure policy (WithFailurePolicy),
// for front ends that read counters themselves, such as a rate limit
// service answering a check of cost 0 with Peek.
func (l *Limiter) FailurePolicy() FailurePolicy { return l.cfg.failure }
