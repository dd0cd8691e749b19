package keyfunc

import (
	"net/http/httptest"
	"net/url"
	"testing"
)

func TestQueryValue(t *testing.T) {
	for _, tc := range []struct{ raw, name, want string }{
		{"plan=free", "plan", "free"},
		{"a=1&plan=free&plan=pro", "plan", "free"},
		{"plan=a+b%21", "plan", "a b!"},
		{"pl%61n=x", "plan", "x"},
		{"plan", "plan", ""},
		{"plan=%zz&plan=ok", "plan", "ok"},
		{"a;b=1&plan=y", "plan", "y"},
		{"", "plan", ""},
		{"planet=1", "plan", ""},
	} {
		if got := queryValue(tc.raw, tc.name); got != tc.want {
			t.Errorf("queryValue(%q, %q) = %q, want %q", tc.raw, tc.name, got, tc.want)
		}
		// The same answer as net/url, where net/url has one.
		if q, err := url.ParseQuery(tc.raw); err == nil && q.Get(tc.name) != tc.want {
			t.Errorf("%q: url.ParseQuery gives %q", tc.raw, q.Get(tc.name))
		}
	}
	r := FromHTTP(httptest.NewRequest("GET", "/x?plan=free", nil)).(QueryRequest)
	if got := r.Query("plan"); got != "free" {
		t.Errorf("FromHTTP(...).Query = %q", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = queryValue("a=1&plan=free", "plan") }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
