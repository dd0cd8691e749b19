package ratefields

import (
	"net/http"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"seconds", header("Retry-After", "120"), 2 * time.Minute, true},
		{"zero", header("Retry-After", "0"), 0, true},
		{"fraction rounded up to the ms", header("Retry-After", "1.0001"), 1001 * time.Millisecond, true},
		{"http date", header("Retry-After", t0.Add(90*time.Second).Format(http.TimeFormat)), 90 * time.Second, true},
		{"http date against the response's Date", header("Retry-After", t0.Add(time.Hour+30*time.Second).Format(http.TimeFormat),
			"Date", t0.Add(time.Hour).Format(http.TimeFormat)), 30 * time.Second, true},
		{"date in the past", header("Retry-After", t0.Add(-time.Hour).Format(http.TimeFormat)), 0, true},
		{"ten years capped", header("Retry-After", "315360000"), MaxWait, true},
		{"a date ten years on capped", header("Retry-After", t0.AddDate(10, 0, 0).Format(http.TimeFormat)), MaxWait, true},
		{"huge number capped", header("Retry-After", "99999999999999999999999999999"), MaxWait, true},
		{"negative ignored", header("Retry-After", "-5"), 0, false},
		{"plus sign ignored", header("Retry-After", "+5"), 0, false},
		{"garbage ignored", header("Retry-After", "soon"), 0, false},
		{"exponent ignored", header("Retry-After", "1e3"), 0, false},
		{"trailing dot ignored", header("Retry-After", "5."), 0, false},
		{"NaN ignored", header("Retry-After", "NaN"), 0, false},
		{"space inside ignored", header("Retry-After", "1 2"), 0, false},
		{"spaces around trimmed", header("Retry-After", " 7 "), 7 * time.Second, true},
		{"absent", header(), 0, false},
		{"empty", header("Retry-After", ""), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := Parse(tc.h, t0)
			if f.RetryAfter != tc.want || f.HasRetryAfter != tc.ok {
				t.Errorf("RetryAfter = %v, %v; want %v, %v", f.RetryAfter, f.HasRetryAfter, tc.want, tc.ok)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    http.Header
		want Budget
	}{
		{"ietf", header("RateLimit", `"default";r=42;t=18`, "RateLimit-Policy", `"default";q=100;w=60`),
			Budget{Source: IETF, Remaining: 42, Limit: 100, Reset: 18 * time.Second, Window: time.Minute, Policy: "default"}},
		{"ietf: the item with the fewest remaining binds", header("RateLimit", `"burst";r=5;t=1, "day";r=2;t=3600, "hour";r=2;t=60`,
			"RateLimit-Policy", `"burst";q=10;w=1, "day";q=1000;w=86400`),
			Budget{Source: IETF, Remaining: 2, Limit: 1000, Reset: time.Hour, Window: 24 * time.Hour, Policy: "day"}},
		{"ietf: a token as the name, no policy", header("RateLimit", `api;r=0;t=2`),
			Budget{Source: IETF, Remaining: 0, Reset: 2 * time.Second, Policy: "api"}},
		{"ietf: items without r are skipped", header("RateLimit", `"a";t=3, "b";r=7`),
			Budget{Source: IETF, Remaining: 7, Policy: "b"}},
		{"ietf: a partition key is read past", header("RateLimit", `"a";r=1;t=2;pk=:cHsdsRa894==:`),
			Budget{Source: IETF, Remaining: 1, Reset: 2 * time.Second, Policy: "a"}},
		{"ietf: negative r skipped, falls back to x-ratelimit", header("RateLimit", `"a";r=-1`, "X-RateLimit-Remaining", "3"),
			Budget{Source: XRateLimit, Remaining: 3}},
		{"ietf: syntax error refuses the field", header("RateLimit", `"a";r=1;t=`, "X-RateLimit-Remaining", "4"),
			Budget{Source: XRateLimit, Remaining: 4}},
		{"ietf: r too long for an integer", header("RateLimit", `"a";r=1234567890123456`), Budget{}},
		{"ietf: huge t capped", header("RateLimit", `"a";r=0;t=999999999999999`),
			Budget{Source: IETF, Reset: MaxWait, Policy: "a"}},
		{"x-ratelimit: seconds", header("X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "30"),
			Budget{Source: XRateLimit, Remaining: 0, Limit: 60, Reset: 30 * time.Second}},
		{"x-ratelimit: github's unix time", header("X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999",
			"X-RateLimit-Reset", "1740832200"), // t0 + 30 min
			Budget{Source: XRateLimit, Remaining: 4999, Limit: 5000, Reset: 30 * time.Minute}},
		{"x-ratelimit: unix time against Date", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "1740832200",
			"Date", t0.Add(20*time.Minute).Format(http.TimeFormat)),
			Budget{Source: XRateLimit, Remaining: 1, Reset: 10 * time.Minute}},
		{"x-ratelimit: unix time against now, within Date's second", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "1740830401",
			"Date", t0.Add(-700*time.Millisecond).Format(http.TimeFormat)), // truncated to t0 - 1s
			Budget{Source: XRateLimit, Remaining: 1, Reset: time.Second}},
		{"x-ratelimit: unix time in ms", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "1740830405000"),
			Budget{Source: XRateLimit, Remaining: 1, Reset: 5 * time.Second}},
		{"x-ratelimit: unix time passed", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "1740830000"),
			Budget{Source: XRateLimit, Remaining: 1}},
		{"x-ratelimit: fractional reset", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "0.25"),
			Budget{Source: XRateLimit, Remaining: 1, Reset: 250 * time.Millisecond}},
		{"x-ratelimit: garbage reset ignored", header("X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "tomorrow"),
			Budget{Source: XRateLimit, Remaining: 1}},
		{"x-ratelimit: negative remaining ignored", header("X-RateLimit-Remaining", "-1"), Budget{}},
		{"x-ratelimit: huge remaining capped", header("X-RateLimit-Remaining", "123456789012345678901234567890"),
			Budget{Source: XRateLimit, Remaining: MaxCount}},
		{"openai", header("X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "59", "X-Ratelimit-Reset-Requests", "1s"),
			Budget{Source: OpenAI, Remaining: 59, Limit: 60, Reset: time.Second}},
		{"openai lower case, minutes", header("x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "6m0s"),
			Budget{Source: OpenAI, Remaining: 0, Reset: 6 * time.Minute}},
		{"nothing", header("Content-Type", "text/plain"), Budget{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Parse(tc.h, t0).Requests; got != tc.want {
				t.Errorf("Requests = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reset string
		want  time.Duration
	}{
		{"6m0s", 6 * time.Minute},
		{"20ms", 20 * time.Millisecond},
		{"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond},
		{"7.66s", 7660 * time.Millisecond},
		{"1.5", 1500 * time.Millisecond},
		{"100h", MaxWait},
		{"99999999999999999999h", MaxWait},
		{"-1s", 0},
		{"1x", 0},
		{"s", 0},
		{".s", 0},
	} {
		h := header("x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-tokens", tc.reset)
		want := Budget{Source: OpenAI, Remaining: 149984, Limit: 150000, Reset: tc.want}
		if got := Parse(h, t0).Tokens; got != want {
			t.Errorf("reset %q: Tokens = %+v, want %+v", tc.reset, got, want)
		}
	}
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	h := header("RateLimit-Policy", `"burst";q=100;w=1, "day";q=5000;w=86400;qu="requests", ("inner" "list");q=3, "noquota";w=5, "zero";q=0`)
	got := Parse(h, t0).Policies
	want := []Policy{{"burst", 100, time.Second}, {"day", 5000, 24 * time.Hour}}
	if len(got) != len(want) {
		t.Fatalf("Policies = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Policies[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestStructuredSyntax(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		ok bool
		n  int
	}{
		{`"a";r=1`, true, 1},
		{`"a";r=1, "b";r=2`, true, 2},
		{`"a"  ,	"b"`, true, 2},
		{`"a";r=1,`, false, 0},
		{`,"a"`, false, 0},
		{`"a";R=1`, false, 0},
		{`"a";r=1.5`, true, 1},
		{`"a";r=1.5555`, false, 0},
		{`"a";r=1234567890123.5`, false, 0},
		{`"a";flag`, true, 1},
		{`"a";b=?1;c=?0`, true, 1},
		{`"a";b=?2`, false, 0},
		{`"es\"c\\ape"`, true, 1},
		{`"bad\escape"`, false, 0},
		{`"unterminated`, false, 0},
		{"\"ctl\x01\"", false, 0},
		{`:abc`, false, 0},
		{`:ab!c:`, false, 0},
		{`("a" "b");p=1, "c"`, true, 1},
		{`("a""b")`, false, 0},
		{`(`, false, 0},
		{`-`, false, 0},
		{`1.`, false, 0},
		{`*tok/en:x`, true, 1},
	} {
		items, ok := parseList(tc.in)
		if ok != tc.ok || len(items) != tc.n {
			t.Errorf("parseList(%q) = %d items, %v; want %d, %v", tc.in, len(items), ok, tc.n, tc.ok)
		}
	}
	if items, _ := parseList(`"es\"c\\ape"`); items[0].name != `es"c\ape` {
		t.Errorf("escaped name = %q", items[0].name)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	long := make([]byte, MaxFieldLen+1)
	for i := range long {
		long[i] = '1'
	}
	if f := Parse(header("Retry-After", string(long)), t0); f.HasRetryAfter {
		t.Errorf("a field over MaxFieldLen was read: %+v", f)
	}
	list := `"a";r=1`
	for range MaxItems {
		list += `, "a";r=1`
	}
	if f := Parse(header("RateLimit", list), t0); f.Requests.Known() {
		t.Errorf("a list of more than MaxItems was read: %+v", f.Requests)
	}
	params := `"a";r=1`
	for range maxParams {
		params += ";x=1"
	}
	if f := Parse(header("RateLimit", params), t0); f.Requests.Known() {
		t.Errorf("an item of more than maxParams was read: %+v", f.Requests)
	}
}

func TestSourceString(t *testing.T) {
	t.Parallel()
	for s, want := range map[Source]string{None: "none", IETF: "ietf", XRateLimit: "x-ratelimit", OpenAI: "openai", 9: "unknown"} {
		if s.String() != want {
			t.Errorf("Source(%d) = %q, want %q", s, s.String(), want)
		}
	}
}
