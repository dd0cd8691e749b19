package middleware

import (
	"fmt"
	"net/http"
	"strconv"
)

// Count says which responses a rule counts (Rule.Count): only the requests
// whose response status matches are charged to its limits. The zero Count
// counts every request.
//
//	// 5 failed logins per 15 minutes: successful ones are free.
//	Count: middleware.Count{Status: []middleware.Status{401, 403}}
//	// Errors only.
//	Count: middleware.Count{Status: []middleware.Status{middleware.Status5xx}}
//
// A request is refused before its handler runs when the client is already
// over the limit. Otherwise it is charged before the handler runs, as
// every request is, and the charge is given back once the response is
// known if its status does not match: so concurrent requests can never
// take a client past its limit (a burst of requests in flight counts in
// full until they answer), at the cost that while requests are in flight
// they hold their share of the limit, and a request that arrives then may
// be refused although the responses in flight will turn out not to count.
//
// The status is what the client gets: the first status written, or 200 at
// the first write or flush (a streaming response counts by its status when
// first written); a connection taken over (a WebSocket) counts as 101; a
// handler that panics counts as 500, whatever it wrote. A front end that
// calls Result.Done instead of Result.Finish leaves the charge counted.
//
// Counting by outcome needs a store that can give charges back (the
// memory and Redis stores, see Refunder) and limits that can be given back:
// the sliding window, fixed window and token bucket (not the sliding log
// or the leaky bucket). It does not apply to shadow rules.
type Count struct {
	// Status, when not empty, counts only responses with one of these
	// statuses or classes.
	Status []Status
	// StatusNot, when not empty, counts only responses with none of
	// these statuses or classes. Only one of Status and StatusNot may be
	// set.
	StatusNot []Status
}

// Status is an HTTP status code, such as 401, or a class of them:
// Status1xx to Status5xx.
type Status int

// The status classes.
const (
	Status1xx Status = 1 // 100 to 199
	Status2xx Status = 2 // 200 to 299
	Status3xx Status = 3 // 300 to 399
	Status4xx Status = 4 // 400 to 499
	Status5xx Status = 5 // 500 to 599
)

// ParseStatus parses a status as a rules file writes it: a code from 100
// to 599 ("401") or a class ("4xx", "5xx").
func ParseStatus(s string) (Status, error) {
	if len(s) == 3 && s[0] >= '1' && s[0] <= '5' && (s[1:] == "xx" || s[1:] == "XX") {
		return Status(s[0] - '0'), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || len(s) != 3 || n < 100 || n > 599 {
		return 0, fmt.Errorf("bad status %q: want a code from 100 to 599 or a class such as \"5xx\"", s)
	}
	return Status(n), nil
}

// String returns the status as ParseStatus reads it.
func (s Status) String() string {
	if s >= Status1xx && s <= Status5xx {
		return strconv.Itoa(int(s)) + "xx"
	}
	return strconv.Itoa(int(s))
}

// valid reports whether s is a code from 100 to 599 or a class.
func (s Status) valid() bool {
	return s >= Status1xx && s <= Status5xx || s >= 100 && s <= 599
}

// matches reports whether the status code code is s or in its class.
func (s Status) matches(code int) bool {
	if s <= Status5xx {
		return code/100 == int(s)
	}
	return code == int(s)
}

// IsZero reports whether c counts every request.
func (c Count) IsZero() bool { return len(c.Status) == 0 && len(c.StatusNot) == 0 }

// Counts reports whether a response with status code counts.
func (c Count) Counts(code int) bool {
	if len(c.Status) > 0 {
		for _, s := range c.Status {
			if s.matches(code) {
				return true
			}
		}
		return false
	}
	for _, s := range c.StatusNot {
		if s.matches(code) {
			return false
		}
	}
	return true
}

// String returns c as the rules file writes it: "status 401,403" or
// "status_not 2xx", or "" for the zero Count.
func (c Count) String() string {
	list, name := c.Status, "status"
	if len(list) == 0 {
		list, name = c.StatusNot, "status_not"
	}
	if len(list) == 0 {
		return ""
	}
	b := []byte(name + " ")
	for i, s := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, s.String()...)
	}
	return string(b)
}

// validate checks c, as compileRule does.
func (c Count) validate() error {
	if len(c.Status) > 0 && len(c.StatusNot) > 0 {
		return fmt.Errorf("count: both Status and StatusNot are set; set one")
	}
	for _, list := range [][]Status{c.Status, c.StatusNot} {
		for _, s := range list {
			if !s.valid() {
				return fmt.Errorf("count: bad status %d: want a code from 100 to 599 or a class (Status1xx to Status5xx)", int(s))
			}
		}
	}
	return nil
}

// panicStatus is the status a handler that panicked counts as.
const panicStatus = http.StatusInternalServerError
