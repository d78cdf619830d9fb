package gossip

import (
	"fmt"
	"strings"

	"github.com/hashicorp/memberlist"
)

// WrapTransport, set as Config.WrapTransport, wraps the member's memberlist transport:
// memberlist's own UDP and TCP transport (bound to Config.Bind) goes in, and what the
// member sends and receives goes through what comes out. It lets a test drop, delay or
// cut the real datagrams and streams between peers (package memberlist's Transport and
// NodeAwareTransport interfaces state the contract: the wrapper must be safe for
// concurrent use and hand every Packet and stream it lets through to memberlist).
// New calls it once; Close shuts the returned transport down, which must shut down the
// one it wraps.
type WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport

// transport makes mc's transport when cfg wraps it: memberlist's NetTransport on mc's
// bind address, wrapped. It returns nil, nil when nothing wraps it (memberlist then makes
// its own).
func (c Config) transport(mc *memberlist.Config) (memberlist.NodeAwareTransport, error) {
	if c.WrapTransport == nil {
		return nil, nil
	}
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger}
	var nt *memberlist.NetTransport
	var err error
	// A port the system picks is bound for TCP first and then for UDP: the UDP port may be
	// taken (as memberlist.Create, try a few times).
	for range 10 {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || mc.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sluice: gossip: %w", err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		if mc.AdvertisePort == 0 {
			mc.AdvertisePort = mc.BindPort
		}
	}
	t := c.WrapTransport(nt)
	mc.Transport = t
	return t, nil
}
