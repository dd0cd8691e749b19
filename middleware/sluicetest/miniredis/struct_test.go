package sluiceminiredis_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	sluiceminiredis "github.com/sluicehq/sluice/middleware/sluicetest/miniredis"
)

// TestStructMatchesRedis checks the pure-Lua struct library that Enable
// adds against Redis's own, on a real redis-server: the same bytes for the
// same values, in every format sluice's scripts use, and the same values
// back from unpacking them. The values are finite, as every number sluice
// packs is (gopher-lua's own arithmetic on infinities and -0 differs from
// Redis's Lua, whatever the library).
func TestStructMatchesRedis(t *testing.T) {
	t.Parallel()
	_, mini := sluiceminiredis.Run(t)
	real := redistest.Standalone(t).Client(t, nil)
	// Each case packs its values with its format, returns the bytes and
	// what unpacking them gives, as strings (%.17g for numbers). Values
	// that gopher-lua does not parse from a string are made by arithmetic
	// (special).
	src := `
local special = {big = 1.5 * 2^1000, sub = 2^-1074, minnorm = 2^-1022, tenth = 1 / 10}
local f = ARGV[1]
local vals = {}
for i = 2, #ARGV do
  local v = ARGV[i]
  if special[v] then v = special[v] else v = tonumber(v) end
  vals[#vals + 1] = v
end
local packed = struct.pack(f, unpack(vals))
local out = {packed}
local got = {struct.unpack(f, packed)}
for i = 1, #got do
  local v = got[i]
  if type(v) == 'number' then v = string.format('%.17g', v) end
  out[#out + 1] = v
end
return out`
	cases := [][]string{
		{"<B", "0"}, {"<B", "84"}, {"<B", "255"},
		{"<H", "0"}, {"<H", "65535"}, {"<HH", "1", "258"},
		{"<I4", "0"}, {"<I4", "4294967295"},
		{"<i6", "0"}, {"<i6", "-1"}, {"<i6", "140737488355327"}, {"<i6", "-140737488355328"}, {"<i6", "1798761600000"},
		{"<i8", "-1"}, {"<i8", "9007199254740992"}, {"<i8", "-9007199254740992"}, {"<i8", "123456789012"},
		{"<d", "0"}, {"<d", "0.5"}, {"<d", "-2.75"}, {"<d", "big"}, {"<d", "sub"},
		{"<d", "minnorm"}, {"<d", "tenth"}, {"<d", "123456789.125"},
		{"<dddd", "1", "2", "3", "4"},
		{"<Bi6i6i6d", "84", "1798761660000", "1798761600000", "100", "3.5"},
		{"<Bi6I4", "76", "1798761600000", "7"},
		{"<i8i8i8i8i8i8i8i8i8", "1", "-2", "3", "-4", "5", "-6", "7", "-8", "9"},
	}
	ctx := context.Background()
	script := redis.NewScript(src)
	for _, c := range cases {
		args := make([]any, len(c))
		for i, a := range c {
			args[i] = a
		}
		want, err := script.Run(ctx, real, nil, args...).StringSlice()
		if err != nil {
			t.Fatalf("%v on redis-server: %v", c, err)
		}
		got, err := script.Run(ctx, mini, nil, args...).StringSlice()
		if err != nil {
			t.Fatalf("%v on miniredis: %v", c, err)
		}
		if len(got) != len(want) {
			t.Errorf("%v: miniredis gives %q, redis-server %q", c, got, want)
			continue
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%v: value %d: miniredis gives %q, redis-server %q", c, i, got[i], want[i])
			}
		}
	}
	// A log's entries are read at an offset (the third argument).
	off := `local s = struct.pack('<HHHH', 1, 2, 3, 4) local a, b, n = struct.unpack('<HH', s, 5) return {a, b, n}`
	want, err := redis.NewScript(off).Run(ctx, real, nil).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	got, err := redis.NewScript(off).Run(ctx, mini, nil).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("unpack from an offset: miniredis gives %v, redis-server %v", got, want)
	}
}
