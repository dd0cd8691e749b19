package redisstore

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// scriptCall returns the keys and arguments of the decision script for a
// request of charges at the explicit instant nowMs, as Store.run sends
// them (all charges in one run, as on a standalone server).
func scriptCall(s *Store, nowMs int64, charge bool, charges []window.Charge) ([]string, []any) {
	req := appendRequest(nil, nowMs, charge)
	var keys []string
	for i := range charges {
		c := &charges[i]
		keys = append(keys, string(s.appendKey(nil, c.Key)))
		req = appendCharge(req, appendField(nil, c), c, nowMs)
	}
	return keys, []any{string(req)}
}

// TestMergedRunsMatchAlone sends the requests of the cross-check table
// (every algorithm, counters named by several requests and several times
// in one request, costs that deny, reads, the clock going back), as the
// Pipeliner merges them, several per script run, and checks that every
// request gets the very reply it gets when run alone, in the same order,
// on counters of its own. Within a run the script keeps the counters it
// read and wrote and writes them once at the end, so this is what shows
// that a request sees what the requests before it in the same run wrote.
func TestMergedRunsMatchAlone(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	alone := newTestStore(t, c, srv.Prefix(t)+"alone:")
	merged := newTestStore(t, c, srv.Prefix(t)+"merged:")
	steps := crossCheckTable()
	// A dry run among them, and a request whose calendar boundaries do
	// not contain its instant: an error reply that fails it alone.
	var bad []window.Charge
	for _, st := range steps {
		if st.charges[0].Limit.Period != 0 {
			// On counters of its own: a calendar counter in a later
			// period than the instant is kept (the clock went back).
			bad = append(bad, st.charges[0])
			bad[0].Key += ":fresh"
			break
		}
	}
	if bad == nil {
		t.Fatal("the cross-check table has no calendar period")
	}

	type req struct {
		keys []string
		args []any
	}
	var reqs []req
	var want []any
	var wantErr []error
	for i, st := range steps {
		mode := i%7 != 3 // a dry run now and then
		nowMs := st.at.UnixMilli()
		keys, args := scriptCall(alone, nowMs, mode, st.charges)
		v, err := redispipe.RunDirect(ctx, c, script, keys, args...)
		want, wantErr = append(want, v), append(wantErr, err)
		keys, args = scriptCall(merged, nowMs, mode, st.charges)
		reqs = append(reqs, req{keys, args})
		if i == len(steps)/2 {
			// The boundaries worked out for an instant a year later.
			later := st.at.AddDate(1, 0, 0).UnixMilli()
			keys := []string{string(merged.appendKey(nil, bad[0].Key))}
			arg := appendCharge(appendRequest(nil, nowMs, true), appendField(nil, &bad[0]), &bad[0], later)
			reqs = append(reqs, req{keys, []any{string(arg)}})
			want, wantErr = append(want, nil), append(wantErr, errors.New("lies outside the calendar periods"))
		}
	}

	// Runs of up to 16 requests, as the Pipeliner sends them.
	for from := 0; from < len(reqs); from += 16 {
		batch := reqs[from:min(from+16, len(reqs))]
		var keys []string
		var head []byte
		var rest []any
		for _, r := range batch {
			keys = append(keys, r.keys...)
			head = redispipe.AppendHeader(head, len(r.keys), len(r.args))
			rest = append(rest, r.args...)
		}
		v, err := script.Run(ctx, c, keys, append([]any{len(batch), string(head)}, rest...)...).Result()
		if err != nil {
			t.Fatalf("run of requests %d to %d: %v", from, from+len(batch)-1, err)
		}
		replies, ok := v.([]any)
		if !ok || len(replies) != len(batch) {
			t.Fatalf("run of requests %d to %d: reply %v", from, from+len(batch)-1, v)
		}
		for j, got := range replies {
			i := from + j
			if e, isErr := got.(error); isErr || wantErr[i] != nil {
				if !isErr || wantErr[i] == nil || !strings.Contains(e.Error(), wantErr[i].Error()) {
					t.Errorf("request %d: merged %v, alone %v, %v", i, got, want[i], wantErr[i])
				}
				continue
			}
			if !reflect.DeepEqual(got, want[i]) {
				t.Errorf("request %d: merged %v, alone %v", i, got, want[i])
			}
		}
	}
}
