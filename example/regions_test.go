package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestRegionsRules(t *testing.T) {
	rl, err := config.Open("regions.yaml", demoEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]middleware.Scope{"global": middleware.ScopeGlobal, "per-region": middleware.ScopeRegion, "otp": middleware.ScopeGlobalStrict}
	for _, r := range rl.Document().Rules {
		if s, ok := want[r.Name]; !ok || r.Scope != s {
			t.Errorf("rule %s: scope %s, want %s", r.Name, r.Scope, s)
		}
	}
}

func TestRegionFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-region", "us-east-1"},
		{"-redis", "127.0.0.1:1", "-peer", "eu-west-1=127.0.0.1:2"},
		{"-peer", "eu-west-1"},
	} {
		if err := run(args); err == nil || !(strings.Contains(err.Error(), "-region") || strings.Contains(err.Error(), "NAME=ADDR")) {
			t.Errorf("%v: error %v", args, err)
		}
	}
}
