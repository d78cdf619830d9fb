package gossip

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gossip/hits"
)

// parseKey reads a key as raw bytes, or base64 or hex text.
func parseKey(b []byte) ([]byte, error) {
	s := strings.TrimSpace(string(b))
	for _, dec := range []func(string) ([]byte, error){base64.StdEncoding.DecodeString, hex.DecodeString} {
		if k, err := dec(s); err == nil && validKeyLen(len(k)) {
			return k, nil
		}
	}
	if validKeyLen(len(b)) {
		return b, nil
	}
	return nil, fmt.Errorf("sluice: gossip key file: want 16, 24 or 32 bytes (raw, base64 or hex), got %d bytes", len(b))
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// MaxMetricTags bounds the tags whose hits /metrics shows, so that a flood of tags cannot
// flood the metrics.
const MaxMetricTags = 1000

var (
	descMembers   = prometheus.NewDesc("sluice_gossip_members", "Members of the pool this member counts on, itself included (live, or lost and still held).", nil, nil)
	descPeers     = prometheus.NewDesc("sluice_gossip_peers_alive", "Peers the membership sees alive.", nil, nil)
	descMsgs      = prometheus.NewDesc("sluice_gossip_messages_total", "Gossip messages (report parts), by direction.", []string{"direction"}, nil)
	descBytes     = prometheus.NewDesc("sluice_gossip_bytes_total", "Bytes of gossip messages, by direction.", []string{"direction"}, nil)
	descMalformed = prometheus.NewDesc("sluice_gossip_malformed_total", "Messages dropped as malformed.", nil, nil)
	descSendErrs  = prometheus.NewDesc("sluice_gossip_send_errors_total", "Messages that could not be sent.", nil, nil)
	descStreams   = prometheus.NewDesc("sluice_gossip_stream_messages_total", "Reports too large for datagrams, sent over a stream.", nil, nil)
	descReports   = prometheus.NewDesc("sluice_gossip_reports_total", "Reports made (one per sync interval).", nil, nil)
	descDropped   = prometheus.NewDesc("sluice_gossip_dropped_entries_total", "Tags in peers' reports dropped because max tags was reached.", nil, nil)
	descTags      = prometheus.NewDesc("sluice_gossip_tags", "Tags held.", nil, nil)
	descHits      = prometheus.NewDesc("sluice_gossip_hits_total", "Permits granted, by bucket (a rule, or rule/tag) and origin (local: here; remote: reported by peers). At most 1000 buckets are shown.", []string{"tag", "origin"}, nil)
	descLocal     = prometheus.NewDesc("sluice_gossip_local_hits_total", "Permits granted here, all tags.", nil, nil)
	descRemote    = prometheus.NewDesc("sluice_gossip_remote_hits_total", "Permits peers reported, all tags.", nil, nil)
	descUncharged = prometheus.NewDesc("sluice_gossip_uncharged_hits_total", "Peers' hits beyond a burst of debt, not charged (after a partition).", nil, nil)
	descForwarded = prometheus.NewDesc("sluice_gossip_forwarded_total", "Requests forwarded to their keys' owners.", nil, nil)
	descAskMsgs   = prometheus.NewDesc("sluice_gossip_ask_messages_total", "Messages that carried forwarded requests (several to a message when callers forward at once).", nil, nil)
	descFwdAgain  = prometheus.NewDesc("sluice_gossip_forward_resent_total", "Forwarded requests sent again, the owner's answer late (a datagram lost).", nil, nil)
	descFwdLate   = prometheus.NewDesc("sluice_gossip_forward_timeouts_total", "Forwarded requests the owner did not answer in time (answered unavailable).", nil, nil)
)

// Describe implements prometheus.Collector.
func (b *Backend) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descPeers, descMsgs, descBytes, descMalformed, descSendErrs, descStreams, descReports, descDropped, descTags, descHits, descLocal, descRemote, descUncharged, descForwarded, descAskMsgs, descFwdAgain, descFwdLate} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the daemon's /metrics shows it.
func (b *Backend) Collect(ch chan<- prometheus.Metric) {
	type tagHits struct {
		tag           string
		local, remote uint64
	}
	var st hits.Stats
	var members int
	var th []tagHits
	b.each(func(i int, n *hits.Node) {
		x := n.Stats()
		if i == 0 { // every shard hears every peer and report: count them once
			st, members = x, n.Members()
		} else {
			st.Tags += x.Tags
			st.Dropped += x.Dropped
			st.LocalHits += x.LocalHits
			st.RemoteHits += x.RemoteHits
			st.EvictedTags += x.EvictedTags
			st.ExcessCharged += x.ExcessCharged
		}
		n.Tags(func(k string) bool {
			if len(th) >= MaxMetricTags {
				return false
			}
			l, r, _ := n.TagHits(k)
			th = append(th, tagHits{k, l, r})
			return true
		})
	})
	g := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	c := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	g(descMembers, float64(members))
	g(descPeers, float64(max(0, b.ml.NumMembers()-1)))
	c(descMsgs, b.stats.msgsSent.Load(), "sent")
	c(descMsgs, b.stats.msgsRecv.Load(), "received")
	c(descBytes, b.stats.bytesSent.Load(), "sent")
	c(descBytes, b.stats.bytesRecv.Load(), "received")
	c(descMalformed, st.Malformed)
	c(descSendErrs, b.stats.sendErrs.Load())
	c(descStreams, b.stats.streams.Load())
	c(descReports, st.Reports)
	c(descDropped, st.Dropped)
	g(descTags, float64(st.Tags))
	c(descLocal, st.LocalHits)
	c(descRemote, st.RemoteHits)
	c(descUncharged, st.ExcessCharged)
	c(descForwarded, b.stats.forwarded.Load())
	c(descAskMsgs, b.stats.askMessages.Load())
	c(descFwdAgain, b.stats.forwardResent.Load())
	c(descFwdLate, b.stats.forwardTimeouts.Load())
	for _, t := range th {
		c(descHits, t.local, label(t.tag), "local")
		c(descHits, t.remote, label(t.tag), "remote")
	}
}

// label shows a key as a metric label: the daemon keys a bucket by its rule's name, a unit
// separator, and (for a rule that gives each tag its own bucket) the tag; shown as RULE or
// RULE/TAG.
func label(key string) string {
	return strings.ReplaceAll(strings.TrimSuffix(key, "\x1f"), "\x1f", "/")
}
