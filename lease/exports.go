package lease

import (
	"github.com/sluicehq/sluice/lease/allot"
)

// The allocation's vocabulary, defined by the pure cores of package lease/allot (which
// the simulator drives too) and named here for users of the lease mode.
type (
	// Config is the allocation's settings for every limit a store's records hold: TTL,
	// Grace, Policy, JoinWindow. Use DefaultConfig; Validate checks it. A record
	// keeps the settings it was made with.
	Config = allot.Config
	// MemberConfig is a member's settings (renewal interval, margin, fail mode, ...). Use
	// DefaultMemberConfig.
	MemberConfig = allot.MemberConfig
	// Policy says how the allocation divides a limit among its live members: Fair or Equal.
	Policy = allot.Policy
	// Share is a part of a limit: its rate in parts of RateScale, and whole permits of
	// its burst.
	Share = allot.Share
	// Epoch names one registration of a member with a record.
	Epoch = allot.Epoch
	// Status is what a member holds of one limit, for observers and metrics.
	Status = allot.Status
)

// Policies.
const (
	// Fair gives max-min fair shares of the members' reported demand: an idle member does
	// not hold capacity a busy one needs. The default.
	Fair = allot.Fair
	// Equal gives each of N live members limit / N, whatever their demand; members agree
	// on N.
	Equal = allot.Equal
)

// RateScale is the rate of a whole limit in a Share's units.
const RateScale = allot.RateScale

// DefaultConfig returns the default allocation settings.
func DefaultConfig() Config { return allot.DefaultConfig() }

// DefaultMemberConfig returns the default member settings.
func DefaultMemberConfig() MemberConfig { return allot.DefaultMemberConfig() }

// ParsePolicy reads "fair" or "equal".
func ParsePolicy(s string) (Policy, error) { return allot.ParsePolicy(s) }
