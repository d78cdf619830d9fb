package gossip_test

import (
	"fmt"

	"github.com/sluicehq/sluice/gossip"
)

// A policy is named from outside the module: the default (Auto) has each small limit
// decided at its key's owner and each large one by shares; Equal gives each member 1/N.
func ExamplePolicy() {
	cfg := gossip.DefaultConfig()
	fmt.Println(cfg.Policy == gossip.Auto)
	cfg.Policy = gossip.Equal
	p, err := gossip.ParsePolicy("whole")
	fmt.Println(cfg.Policy, p, err)
	// Output:
	// true
	// equal whole <nil>
}
