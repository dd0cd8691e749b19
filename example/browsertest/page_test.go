package browsertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

const token = "browser-test-token"

// client is the key of the client that sends the burst: failed logins of
// the account mallory from this machine (the example's login rule keys by
// account and address, and bans after 5 failures).
const client = "account:mallory|ip:127.0.0.1"

// TestOperatorPage drives the example's operator page in headless
// Chromium:
//
//  1. starts the example, which prints the page's address;
//  2. sends a burst of failed logins from one client;
//  3. signs in on the page and sees that client among the top clients of
//     the login rule, by units denied;
//  4. lifts the ban the burst earned, bans the client again from the top
//     list and lifts that ban too, each time checking the API;
//  5. checks that a cross-site POST to the admin handler, from a page of
//     another origin in the same browser (signed in), is refused.
//
// It keeps screenshots at 1280×800 and at a phone's width, in
// $SLUICE_SCREENSHOTS (or a temporary directory), and logs their paths.
func TestOperatorPage(t *testing.T) {
	browser := findChromium(t)
	bin := buildExample(t)

	// 1. The example, on free loopback ports.
	appAddr, adminAddr := freeAddr(t), freeAddr(t)
	pageURL := startExample(t, bin, appAddr, adminAddr)
	t.Logf("operator page at %s", pageURL)

	// 2. A burst from one client: 5 failures (401), then 429 and a ban.
	var codes []int
	for range 12 {
		res, err := http.PostForm("http://"+appAddr+"/login?user=mallory", url.Values{"password": {"guess"}})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		codes = append(codes, res.StatusCode)
	}
	if fmt.Sprint(codes[:6]) != "[401 401 401 401 401 429]" {
		t.Fatalf("burst answered %v, want 5 × 401 then 429", codes)
	}
	// Other clients, below their limits: the list has more than one.
	for user, n := range map[string]int{"alice": 1, "bob": 3, "carol": 2} {
		for range n {
			res, err := http.PostForm("http://"+appAddr+"/login?user="+user, url.Values{"password": {"guess"}})
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
		}
	}

	ctx := newBrowser(t, browser)
	top := fmt.Sprintf(`#top tbody tr[data-key=%q]`, client)
	ban := fmt.Sprintf(`#bans tbody tr[data-key=%q]`, client)

	// 3. Sign in; the client is among the top clients of the login rule.
	run(t, ctx, "sign in and find the client",
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(pageURL),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		chromedp.Click(chromedp.CSS(`#signin-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#app`)),
		chromedp.WaitReady(chromedp.CSS(`#top-rule option[value="login"]`)),
		chromedp.SetValue(chromedp.CSS(`#top-rule`), "login"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("top-rule").dispatchEvent(new Event("change"))`),
		chromedp.WaitVisible(chromedp.CSS(top)),
		chromedp.WaitVisible(chromedp.CSS(ban)),
	)
	count := value(t, ctx, "read the count", chromedp.Text(chromedp.CSS(top+` td:nth-child(2)`)))
	run(t, ctx, "peek the client",
		chromedp.Click(chromedp.CSS(top+` a.peek-link`)),
		chromedp.WaitVisible(chromedp.CSS(`#peek-table tbody tr`)),
	)
	if got := value(t, ctx, "read the peek", chromedp.Text(chromedp.CSS(`#peek-key`))); got != client {
		t.Errorf("peek shows %q, want %q", got, client)
	}
	if want := fmt.Sprint(countOf(codes, 429)); count != want {
		t.Errorf("the page shows %s units denied, want %s", count, want)
	}
	if n := banTotal(t, adminAddr); n != 1 {
		t.Fatalf("the API lists %d bans after the burst, want 1", n)
	}
	// By units charged: the burst's client first, then the others.
	run(t, ctx, "rank by units charged",
		chromedp.SetValue(chromedp.CSS(`#top-by`), "charged"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("top-by").dispatchEvent(new Event("change"))`),
		chromedp.WaitVisible(chromedp.CSS(`#top tbody tr:nth-child(4)`)),
	)
	if got := value(t, ctx, "read the first key", chromedp.Text(chromedp.CSS(`#top tbody tr:first-child code`))); got != client {
		t.Errorf("first by units charged: %q, want %q", got, client)
	}
	screenshot(t, ctx, "operator-page-1280x800.png")

	// 4. Lift the ban; ban the client from the top list; lift again.
	lift := func(what string) {
		t.Helper()
		run(t, ctx, what,
			chromedp.Click(chromedp.CSS(ban+` button.lift`)),
			chromedp.WaitNotPresent(chromedp.CSS(ban)),
		)
		if n := banTotal(t, adminAddr); n != 0 {
			t.Fatalf("%s: the API lists %d bans, want 0", what, n)
		}
	}
	lift("lift the burst's ban")
	run(t, ctx, "ban from the top list",
		chromedp.WaitVisible(chromedp.CSS(top+` button.danger`)),
		chromedp.Click(chromedp.CSS(top+` button.danger`)),
		chromedp.WaitVisible(chromedp.CSS(ban)),
		chromedp.WaitVisible(chromedp.CSS(top+` .badge.banned`)),
	)
	if n := banTotal(t, adminAddr); n != 1 {
		t.Fatalf("the API lists %d bans after banning from the page, want 1", n)
	}
	lift("lift the page's ban")

	// At a phone's width: nothing wider than the screen.
	run(t, ctx, "phone width",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile),
		chromedp.Sleep(300*time.Millisecond), // a layout
	)
	overflow := value(t, ctx, "measure the page", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`))
	if overflow {
		t.Error("the page is wider than a phone's screen")
	}
	screenshot(t, ctx, "operator-page-phone.png")
	run(t, ctx, "desktop again", chromedp.EmulateViewport(1280, 800))

	// 5. A page of another origin (the same host, another port: the same
	// site, so the SameSite cookie goes along) posts a ban to the admin
	// handler in the signed-in browser: refused by the origin check.
	target := "http://" + adminAddr + "/bans?" + url.Values{"rule": {"login"}, "key": {client}}.Encode()
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s"></form><script>document.getElementById("f").submit()</script>`, target)
	}))
	t.Cleanup(evil.Close)
	run(t, ctx, "open a page of another origin", chromedp.Navigate(evil.URL))
	value(t, ctx, "wait for the admin handler's answer",
		chromedp.Poll[bool](`location.host === `+fmt.Sprintf("%q", adminAddr)+` && document.body.innerText.length > 0`))
	body := value(t, ctx, "read the answer", chromedp.Evaluate[string](`document.body.innerText`))
	loc := value(t, ctx, "read the location", chromedp.Location())
	if !strings.Contains(body, "cross-origin request refused") {
		t.Errorf("the cross-site POST got %q at %s, want the origin check's refusal", body, loc)
	}
	if n := banTotal(t, adminAddr); n != 0 {
		t.Errorf("the cross-site POST banned the client: %d bans", n)
	}
}

func countOf(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// findChromium returns the path of Debian's chromium (make test installs
// it); without it the test skips, or fails when CI is set.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found: make test installs it (apt-get install chromium)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// buildExample builds the example server (the module in the parent
// directory) and returns its path.
func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "example")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build the example: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// pageLine is how the example prints the operator page's address.
var pageLine = regexp.MustCompile(`operator page: (http://\S+/)`)

// startExample starts the example and returns the page address it
// printed; the process is stopped (by its pid) when the test ends.
func startExample(t *testing.T, bin, appAddr, adminAddr string) string {
	t.Helper()
	cmd := exec.Command(bin, "-addr", appAddr, "-admin-addr", adminAddr)
	cmd.Env = append(os.Environ(), "SLUICE_ADMIN_TOKEN="+token)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			if m := pageLine.FindStringSubmatch(sc.Text()); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
	}()
	select {
	case u := <-found:
		if u != "http://"+adminAddr+"/" {
			t.Fatalf("the example printed the page at %s, want http://%s/", u, adminAddr)
		}
		waitServing(t, "http://"+appAddr+"/")
		return u
	case <-time.After(30 * time.Second):
		t.Fatal("the example printed no operator page address within 30 s")
		return ""
	}
}

// waitServing waits until u answers.
func waitServing(t *testing.T, u string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get(u)
		if err == nil {
			res.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer: %v", u, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// banTotal asks the admin API how many bans are in force.
func banTotal(t *testing.T, adminAddr string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+adminAddr+"/bans", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Total int `json:"total"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != 200 {
		t.Fatalf("GET /bans: %d, %v", res.StatusCode, err)
	}
	return out.Total
}

// newBrowser starts headless Chromium as this machine needs it (no
// sandbox as root, no GPU, no background connections to a closed
// network) in a fresh profile, with a 1280×800 window, and returns its
// context, good for two minutes.
func newBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	ctx, cancelTimeout := context.WithTimeout(context.Background(), 2*time.Minute)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancelTimeout()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// run runs actions, failing the test with what was being done.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(step, actions...); err != nil {
		failPage(t, ctx, what, err)
	}
}

// value runs an action that returns a value, failing the test with what
// was being done.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(step, a)
	if err != nil {
		failPage(t, ctx, what, err)
	}
	return v
}

// failPage fails the test, with the page's body for the story.
func failPage(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("body")))
	t.Fatalf("%s: %v\npage: %.2000s", what, err, html)
}

// screenshot saves the page as it is to $SLUICE_SCREENSHOTS/name (or a
// temporary directory) and logs where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("SLUICE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sluice-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png := value(t, ctx, "screenshot "+name, chromedp.CaptureScreenshot())
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}
