// Command overload measures adaptive concurrency, shedding by priority and
// elastic limits against a handler of fixed capacity, with an open-loop
// load generator in a separate process.
//
//	go run ./internal/cmd/overload                 # every scenario (about 2.5 minutes)
//	go run ./internal/cmd/overload -scenarios capacity -duration 5s
//
// It runs itself three ways: "run" (the default) starts a server process
// and load processes and prints the figures; "server" serves a handler
// with -slots slots of -service each (8 × 20ms: 400 requests/s), behind no
// limiter, a static concurrency limit, an adaptive one, or elastic limits;
// "load" sends requests at a fixed rate whatever the answers (open loop),
// each with its own deadline, and reports what came back as JSON. The
// figures of one run are in BENCHMARKS.md ("Overload"); docs/overload.md
// describes what is measured.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	mode := "run"
	if len(os.Args) > 1 && (os.Args[1] == "server" || os.Args[1] == "load" || os.Args[1] == "run") {
		mode = os.Args[1]
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	var err error
	switch mode {
	case "server":
		err = serverMain(flag.CommandLine)
	case "load":
		err = loadMain(flag.CommandLine)
	default:
		err = runMain(flag.CommandLine)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
}
