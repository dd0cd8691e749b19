package clients

import (
	"encoding/json"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// limitJSON is a Limit as overrides are kept in a shared store.
type limitJSON struct {
	Requests   int    `json:"requests"`
	WindowMs   int64  `json:"window_ms,omitempty"`
	Algorithm  uint8  `json:"algorithm,omitempty"`
	Burst      int    `json:"burst,omitempty"`
	Period     uint8  `json:"period,omitempty"`
	TimeZone   string `json:"time_zone,omitempty"`
	MaxLog     int    `json:"max_log,omitempty"`
	MaxDelayMs int64  `json:"max_delay_ms,omitempty"`
	BanMs      int64  `json:"ban_ms,omitempty"`
}

// EncodeLimits encodes the limits of an override as a shared store keeps
// them: a JSON array, one object per limit. A limit's Ceiling is not kept
// (an override has none).
func EncodeLimits(limits []window.Limit) ([]byte, error) {
	out := make([]limitJSON, len(limits))
	for i, l := range limits {
		out[i] = limitJSON{Requests: l.Requests, WindowMs: l.Window.Milliseconds(), Algorithm: uint8(l.Algorithm), Burst: l.Burst,
			Period: uint8(l.Period), MaxLog: l.MaxLog, MaxDelayMs: l.MaxDelay.Milliseconds(), BanMs: l.Ban.Milliseconds()}
		if l.Location != nil {
			out[i].TimeZone = l.Location.String()
		}
	}
	return json.Marshal(out)
}

// DecodeLimits decodes what EncodeLimits encoded, and returns an error if
// b is not such an array or one of its limits is invalid
// (window.Limit.Validate) or names an unknown time zone. b comes from a
// shared store, which other processes write: it is not trusted.
func DecodeLimits(b []byte) ([]window.Limit, error) {
	var in []limitJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	out := make([]window.Limit, len(in))
	for i, j := range in {
		l := window.Limit{Requests: j.Requests, Window: time.Duration(j.WindowMs) * time.Millisecond, Algorithm: window.Algorithm(j.Algorithm),
			Burst: j.Burst, Period: window.Period(j.Period), MaxLog: j.MaxLog, MaxDelay: time.Duration(j.MaxDelayMs) * time.Millisecond,
			Ban: time.Duration(j.BanMs) * time.Millisecond}
		if j.TimeZone != "" {
			loc, err := time.LoadLocation(j.TimeZone)
			if err != nil {
				return nil, err
			}
			l.Location = loc
		}
		if err := l.Validate(); err != nil {
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}
