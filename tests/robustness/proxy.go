package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/collectors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Net is the in-process toxiproxy: one TCP proxy per member slot in front of the store,
// whose toxics the schedule switches on and off. Its methods are safe for concurrent use.
type Net struct {
	server *toxiproxy.ApiServer
	mu     sync.Mutex
	byName map[string]*toxiproxy.Proxy
}

// NewNet starts nothing yet: proxies are added by Proxy.
//
// Toxics log through zerolog's global logger: NewNet turns zerolog's global level off, for
// the process (the suite's runner, which uses zerolog for nothing else).
func NewNet() *Net {
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	srv.Metrics.ProxyMetrics = collectors.NewProxyMetricCollectors()
	return &Net{server: srv, byName: map[string]*toxiproxy.Proxy{}}
}

// Proxy starts a proxy named name on a free loopback port to upstream and returns its
// address.
func (n *Net) Proxy(name, upstream string) (string, error) {
	p := toxiproxy.NewProxy(n.server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("robust: proxy %s: %w", name, err)
	}
	n.mu.Lock()
	n.byName[name] = p
	n.mu.Unlock()
	return p.Listen, nil
}

func (n *Net) proxy(name string) (*toxiproxy.Proxy, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.byName[name]
	if p == nil {
		return nil, fmt.Errorf("robust: no proxy %s", name)
	}
	return p, nil
}

// AddToxic adds a toxic to the proxy name, on its downstream (toward the member) or
// upstream (toward the store) stream, named toxic.
func (n *Net) AddToxic(name, toxic, kind, stream string, attrs map[string]int) error {
	p, err := n.proxy(name)
	if err != nil {
		return err
	}
	js, _ := json.Marshal(map[string]any{"name": toxic, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(js))); err != nil {
		return fmt.Errorf("robust: proxy %s: toxic %s: %w", name, kind, err)
	}
	return nil
}

// RemoveToxic removes a toxic added by AddToxic.
func (n *Net) RemoveToxic(name, toxic string) error {
	p, err := n.proxy(name)
	if err != nil {
		return err
	}
	return p.Toxics.RemoveToxic(context.Background(), toxic)
}

// Down stops the proxy name listening (and closes its connections): connections are
// refused until Up.
func (n *Net) Down(name string) error {
	p, err := n.proxy(name)
	if err != nil {
		return err
	}
	p.Stop()
	return nil
}

// Up starts the proxy name again on the same address.
func (n *Net) Up(name string) error {
	p, err := n.proxy(name)
	if err != nil {
		return err
	}
	return p.Start()
}

// Close stops every proxy.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.byName {
		p.Toxics.ResetToxics(context.Background())
		p.Stop()
	}
	n.byName = map[string]*toxiproxy.Proxy{}
}
