// Command quickstart is the first example of the README: five requests a
// minute per client address, counted in memory.
package main

import (
	"log"
	"net/http"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func main() {
	// 5 requests a minute per client address, counted in memory.
	lim, err := middleware.New(middleware.PerMinute(5), keyfunc.RemoteIP())
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello\n"))
	})
	log.Fatal(http.ListenAndServe(":8080", lim.Handler(hello)))
}
