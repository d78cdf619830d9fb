package strict

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// TestLeanBatchesAgree: the script's lean batches (every key once, one allowance, or one
// decision of n > 0 permits, under one limit, the further keys' records sent as '=') and
// its lone shortcuts answer and write exactly as its general path does for the same
// records, which the test forces by sending each key's record in full (1 record, not
// '=') and a decision's count of limits as "01". Keys in every state, in random orders: missing, in the common state (marked and
// not), under a penalty or two limits (the lean batch stops there and hands the whole
// batch to the general path, after writing the keys before it), holding another type
// (WRONGTYPE, found by the lean batch's SET ... GET) or another format. Virtual now, so
// that both runs decide at the same instant.
func TestLeanBatchesAgree(t *testing.T) {
	c := newClient(t, shared.URL())
	pfx := prefix(t)
	script := goredis.NewScript(scriptSource)
	const now = int64(1_795_000_000)*1e9 + 123_456_789
	mode := fmt.Sprintf("%d %d", now/1e9, now%1e9)
	// Tau 3 s, T 1 s: a burst of 3.
	states := []func(name string){
		func(string) {}, // missing
		func(name string) { c.Set(ctx, name, fmt.Sprintf("1 0 0 %d %d", now/1e9+1, 5), 0) },           // common, 1 s ahead
		func(name string) { c.Set(ctx, name, fmt.Sprintf("1 0 00 %d %d", now/1e9-5, 0), 0) },          // common, marked, idle
		func(name string) { c.Set(ctx, name, fmt.Sprintf("1 0 0 %d %d", now/1e9+3, 200_000_000), 0) }, // full: denied
		func(name string) { c.Set(ctx, name, fmt.Sprintf("1 %d 0 %d 0", now/1e9+1, now/1e9), 0) },     // a penalty in force
		func(name string) { c.Set(ctx, name, fmt.Sprintf("1 0 0 %d 0 %d 0", now/1e9, now/1e9+1), 0) }, // two limits
		func(name string) { c.HSet(ctx, name, "f", "v") },                                             // another type
		func(name string) { c.Set(ctx, name, "2 0 0 5 0", 0) },                                        // another format
	}
	records := map[string][]any{
		"allow":     {"a", 3, 0, 1, 0},
		"decide":    {"d", 1, 0, 0, 1, 3, 0, 1, 0},
		"decide 2":  {"d", 2, 0, 0, 1, 3, 0, 2, 0},
		"wait":      {"d", 1, 5, 0, 1, 3, 0, 1, 0}, // maxDelay 5 s
		"wait 3 of": {"d", 3, 1, 500_000_000, 1, 3, 0, 3, 0},
	}
	rng := rand.New(rand.NewPCG(7, 22))
	for round := 0; round < 300; round++ {
		for what, rec := range records {
			nkeys := 1 + rng.IntN(6)
			kinds := make([]int, nkeys)
			for i := range kinds {
				kinds[i] = rng.IntN(len(states))
				if rng.IntN(2) == 0 {
					kinds[i] = rng.IntN(3) // mostly the states the lean batches decide
				}
			}
			run := func(lean bool) (any, []string) {
				names := make([]string, nkeys)
				for i, k := range kinds {
					names[i] = fmt.Sprintf("%s%d:%s:%d", pfx, round, what, i)
					c.Del(ctx, names[i])
					states[k](names[i])
				}
				args := []any{mode}
				for i := range names {
					switch {
					case lean && i > 0:
						args = append(args, "=")
					case lean || rec[0] != "d":
						args = append(append(args, 1), rec...)
					default:
						// k written "01": the general path reads it as 1, and no shortcut
						// takes a record whose k is not the literal "1".
						args = append(append(append(args, 1), rec[:4]...), "01")
						args = append(args, rec[5:]...)
					}
				}
				got, err := script.Run(ctx, c, names, args...).Result()
				if err != nil {
					t.Fatalf("round %d, %s on %v (lean %v): %v", round, what, kinds, lean, err)
				}
				after := make([]string, nkeys)
				for i, n := range names {
					after[i] = c.Type(ctx, n).Val()
					if after[i] == "string" {
						after[i] = c.Get(ctx, n).Val()
					}
					c.Del(ctx, n)
				}
				return got, after
			}
			lean, leanAfter := run(true)
			general, generalAfter := run(false)
			if !reflect.DeepEqual(lean, general) || !reflect.DeepEqual(leanAfter, generalAfter) {
				t.Fatalf("round %d: %s on keys in states %v:\nlean    %v, then %q\ngeneral %v, then %q",
					round, what, kinds, lean, leanAfter, general, generalAfter)
			}
		}
	}
}
