package config_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// serviceFile is the Envoy ratelimit README's examples 2, 3, 4 and 7 in
// one domain, with keys no HTTP request has.
const serviceFile = `
domain: svc
descriptors:
  - key: message_type          # example 2: nested, and a level alone
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: remote_address        # example 3: the exact value first
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: key                   # example 4: only at the same depth
    value: value
    descriptors:
      - key: subkey
        rate_limit: {unit: second, requests_per_unit: 300}
  - key: key_1                 # example 7: replaces
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: second
          requests_per_unit: 10
  - key: files
    value: "files/*"
    rate_limit: {unit: hour, requests_per_unit: 7}
`

// d builds a descriptor from "k=v" pairs.
func d(pairs ...string) config.Descriptor {
	var desc config.Descriptor
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		desc.Entries = append(desc.Entries, config.DescriptorEntry{Key: k, Value: v})
	}
	return desc
}

// TestDescriptorRequestMatching decides descriptor requests against a file
// parsed for a rate limit service and checks which rule applied to each
// descriptor, and with what limit.
func TestDescriptorRequestMatching(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, serviceFile, config.Env{RateLimitService: true})
	lim, _ := limiter(t, cfg)
	tests := []struct {
		name  string
		descs []config.Descriptor
		// want is, per descriptor, the rule that applied and its limit
		// ("rule/limit"), "deny:rule" for requests_per_unit 0, or "" for
		// none.
		want []string
	}{
		{"nested", []config.Descriptor{d("message_type=marketing", "to_number=2061111111")}, []string{"svc.message_type_marketing.to_number/5"}},
		{"level alone", []config.Descriptor{d("to_number=2061111111")}, []string{"svc.to_number/100"}},
		{"two descriptors", []config.Descriptor{d("message_type=marketing", "to_number=1"), d("to_number=1")},
			[]string{"svc.message_type_marketing.to_number/5", "svc.to_number/100"}},
		{"other value of an exact level", []config.Descriptor{d("message_type=transactional", "to_number=1")}, []string{""}},
		{"any address", []config.Descriptor{d("remote_address=50.0.0.1")}, []string{"svc.remote_address/10"}},
		{"blocked address", []config.Descriptor{d("remote_address=50.0.0.5")}, []string{"deny:svc.remote_address_50.0.0.5"}},
		{"deeper than the rule", []config.Descriptor{d("remote_address=50.0.0.1", "x=y")}, []string{""}},
		{"shallower than the rule", []config.Descriptor{d("key=value")}, []string{""}},
		{"same depth", []config.Descriptor{d("key=value", "subkey=s")}, []string{"svc.key_value.subkey/300"}},
		{"keys out of order", []config.Descriptor{d("subkey=s", "key=value")}, []string{""}},
		{"not replaced alone", []config.Descriptor{d("key_1=value_1", "user=bkthomps")}, []string{"specific_limit/5"}},
		{"replaced by another descriptor", []config.Descriptor{d("key_1=value_1", "user=bkthomps"), d("key_2=value_2", "user=bkthomps")},
			[]string{"", "svc.key_2_value_2.user_bkthomps/10"}},
		{"prefix", []config.Descriptor{d("files=files/a.pdf")}, []string{"svc.files_files_-a620043cab08/7"}},
		{"empty value", []config.Descriptor{d("to_number=")}, []string{""}},
	}
	for _, tt := range tests {
		for i := range tt.descs {
			res, err := lim.Decide(config.NewDescriptorRequest(context.Background(), tt.descs, i))
			if err != nil {
				t.Fatalf("%s[%d]: %v", tt.name, i, err)
			}
			got := ""
			switch {
			case res.Outcome == middleware.OutcomeDenied && res.RetryAfter < 0:
				got = "deny:" + res.Rule
			case res.Rule != "":
				got = res.Rule + "/" + strconv.Itoa(res.Limit.Requests)
			}
			if got != tt.want[i] {
				t.Errorf("%s[%d]: applied %q, want %q", tt.name, i, got, tt.want[i])
			}
		}
	}
}

// TestDescriptorRequestCounting checks that a rule counts each value of
// its levels apart, costs the descriptor's Cost, and that the rules of a
// service file never match an HTTP request.
func TestDescriptorRequestCounting(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, serviceFile, config.Env{RateLimitService: true})
	lim, _ := limiter(t, cfg)
	decide := func(cost int, pairs ...string) middleware.Result {
		t.Helper()
		desc := d(pairs...)
		desc.Cost = cost
		res, err := lim.Decide(config.NewDescriptorRequest(context.Background(), []config.Descriptor{desc}, 0))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := decide(3, "message_type=marketing", "to_number=A"); !res.Allowed || res.Remaining != 2 {
		t.Fatalf("cost 3 of 5: allowed %v, remaining %d, want true, 2", res.Allowed, res.Remaining)
	}
	if res := decide(3, "message_type=marketing", "to_number=A"); res.Allowed {
		t.Fatal("cost 3 with 2 remaining: allowed")
	}
	if res := decide(1, "message_type=marketing", "to_number=B"); !res.Allowed || res.Remaining != 4 {
		t.Fatalf("another number: allowed %v, remaining %d, want true, 4", res.Allowed, res.Remaining)
	}
	if res := decide(0, "message_type=marketing", "to_number=A"); !res.Allowed || res.Remaining != 1 {
		t.Fatalf("cost 0 counts as 1: allowed %v, remaining %d, want true, 1", res.Allowed, res.Remaining)
	}
	res, err := lim.Decide(keyfunc.FromHTTP(request("GET", "/", "50.0.0.5:1")))
	if err != nil || res.Outcome != middleware.OutcomeUnlimited {
		t.Fatalf("HTTP request: outcome %v, err %v, want unlimited", res.Outcome, err)
	}
}

// TestDescriptorServiceKeys checks that any key is accepted for a rate
// limit service and rejected otherwise.
func TestDescriptorServiceKeys(t *testing.T) {
	t.Parallel()
	src := "domain: d\ndescriptors:\n  - key: database\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	if _, err := config.Parse([]byte(src), "f.yaml", config.Env{}); err == nil || !strings.Contains(err.Error(), `unknown descriptor key "database"`) {
		t.Fatalf("HTTP: err %v, want an unknown descriptor key", err)
	}
	cfg := mustParse(t, src, config.Env{RateLimitService: true})
	if cfg.HeaderStyleSet() {
		t.Error("HeaderStyleSet without headers: true")
	}
	cfg = mustParse(t, "headers: draft\n"+src, config.Env{RateLimitService: true})
	if !cfg.HeaderStyleSet() {
		t.Error("HeaderStyleSet with headers: false")
	}
}
