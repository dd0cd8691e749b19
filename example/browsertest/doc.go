// Package browsertest drives the example server's operator page in a
// headless Chromium (Debian's chromium package, through chromedp): sign
// in, see a client that sent a burst among the top clients, ban it and
// lift the ban from the page, and check that a cross-site request is
// refused. It is a module of its own, so that users of sluice never
// download a browser driver.
package browsertest
