package redistest

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// InfoMemory returns the numeric fields of c's INFO memory section, such
// as used_memory and mem_clients_normal.
func InfoMemory(t testing.TB, c redis.Cmdable) map[string]int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			fields[k] = n
		}
	}
	return fields
}
