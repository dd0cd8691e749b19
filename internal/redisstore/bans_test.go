package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestBans(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var s *Store
			if mode == "cluster" {
				cl := redistest.SharedCluster(t)
				s = newTestStore(t, cl.Client(t, nil), cl.Prefix(t))
			} else {
				srv := redistest.Shared(t)
				s = newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
			}
			ctx := context.Background()
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			v0, err := s.AdminVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			until, err := s.SetBan(ctx, t0, "login", "ip:192.0.2.1", time.Hour)
			if err != nil || !until.Equal(t0.Add(time.Hour)) {
				t.Fatalf("SetBan = %v, %v; want %v", until, err, t0.Add(time.Hour))
			}
			// A shorter ban later does not shorten it.
			if until, err := s.SetBan(ctx, t0.Add(time.Minute), "login", "ip:192.0.2.1", time.Second); err != nil || !until.Equal(t0.Add(time.Hour)) {
				t.Fatalf("shorter SetBan = %v, %v; want the first end", until, err)
			}
			for _, c := range []struct {
				at        time.Duration
				rule, key string
				want      time.Time
			}{
				{0, "login", "ip:192.0.2.1", t0.Add(time.Hour)},
				{59 * time.Minute, "login", "ip:192.0.2.1", t0.Add(time.Hour)},
				{time.Hour, "login", "ip:192.0.2.1", time.Time{}},
				{0, "other", "ip:192.0.2.1", time.Time{}},
				{0, "login", "ip:192.0.2.2", time.Time{}},
			} {
				got, err := s.BannedUntil(ctx, t0.Add(c.at), c.rule, c.key)
				if err != nil || !got.Equal(c.want) {
					t.Errorf("BannedUntil(T0+%s, %s, %s) = %v, %v; want %v", c.at, c.rule, c.key, got, err, c.want)
				}
			}
			if _, err := s.SetBan(ctx, t0, "login", "ip:192.0.2.3", 2*time.Hour); err != nil {
				t.Fatal(err)
			}
			bans, total, err := s.Bans(ctx, t0.Add(time.Minute), 10)
			if err != nil || total != 2 || len(bans) != 2 || bans[0].Key != "ip:192.0.2.1" || bans[1].Rule != "login" || !bans[1].Until.Equal(t0.Add(2*time.Hour)) {
				t.Fatalf("Bans = %v, %d, %v", bans, total, err)
			}
			if bans, total, _ := s.Bans(ctx, t0.Add(90*time.Minute), 10); total != 1 || len(bans) != 1 || bans[0].Key != "ip:192.0.2.3" {
				t.Fatalf("Bans after the first ended = %v, %d", bans, total)
			}
			if ok, err := s.LiftBan(ctx, "login", "ip:192.0.2.3"); !ok || err != nil {
				t.Fatalf("LiftBan = %v, %v", ok, err)
			}
			if got, _ := s.BannedUntil(ctx, t0, "login", "ip:192.0.2.3"); !got.IsZero() {
				t.Fatalf("lifted ban still in force until %v", got)
			}
			if ok, _ := s.LiftBan(ctx, "login", "ip:192.0.2.3"); ok {
				t.Fatal("LiftBan of no ban reported one")
			}
			if v, _ := s.AdminVersion(ctx); v <= v0 {
				t.Fatalf("version %d after lifting, was %d", v, v0)
			}
		})
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	s := newTestStore(t, srv.Client(t, nil), srv.Prefix(t))
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.SetOverride(ctx, t0, "api", "user:a", []byte("A"), time.Time{}, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.SetOverride(ctx, t0, "api", "user:b", []byte("B"), t0.Add(time.Minute), 2); err != nil {
		t.Fatal(err)
	}
	v1, list, err := s.LoadOverrides(ctx)
	if err != nil || len(list) != 2 || v1 < 2 {
		t.Fatalf("LoadOverrides = %d, %v, %v", v1, list, err)
	}
	for _, o := range list {
		switch o.Key {
		case "user:a":
			if string(o.Value) != "A" || !o.Until.IsZero() || o.Rule != "api" {
				t.Errorf("user:a: %+v", o)
			}
		case "user:b":
			if string(o.Value) != "B" || !o.Until.Equal(t0.Add(time.Minute)) {
				t.Errorf("user:b: %+v", o)
			}
		}
	}
	// Full: a third is refused and changes nothing; replacing one is fine.
	if err := s.SetOverride(ctx, t0, "api", "user:c", []byte("C"), time.Time{}, 2); !errors.Is(err, ErrTooManyOverrides) {
		t.Fatalf("third override: %v, want ErrTooManyOverrides", err)
	}
	if err := s.SetOverride(ctx, t0, "api", "user:a", []byte("A2"), time.Time{}, 2); err != nil {
		t.Fatal(err)
	}
	// Once user:b ended, its place is free.
	if err := s.SetOverride(ctx, t0.Add(2*time.Minute), "api", "user:c", []byte("C"), time.Time{}, 2); err != nil {
		t.Fatalf("after user:b ended: %v", err)
	}
	if ok, err := s.RemoveOverride(ctx, "api", "user:a"); !ok || err != nil {
		t.Fatalf("RemoveOverride = %v, %v", ok, err)
	}
	v2, list, _ := s.LoadOverrides(ctx)
	if len(list) != 1 || list[0].Key != "user:c" || v2 <= v1 {
		t.Fatalf("after remove: %d, %+v", v2, list)
	}
}
