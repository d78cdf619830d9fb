package server

// Reloading the config in place (Reload, and ReloadFrom for SIGHUP or a changed file):
// the rules and bounds change, what is set up at start stays until a restart.

import (
	"maps"
	"reflect"
	"time"
)

// Reload replaces the rules, limits, margin and token with cfg's, keeping every connection
// and every bucket whose rule keeps its name. The bounds on connections, lines, pending
// answers and time-outs apply from then on to new connections, and shutdown_grace to the
// next shutdown. What is set up at start stays as it was, with a warning if cfg changes
// it: the listen addresses, the back end and its Redis settings, the fail mode and
// fallback share, max_keys and logging. A config with an error is refused (the old one
// stays), logged and counted, as ReloadFrom does.
func (s *Server) Reload(cfg Config) error {
	return s.ReloadFrom("api", func() (Config, error) { return cfg, nil })
}

// ReloadFrom reloads the config load returns (reading a file: SIGHUP, or the file changed),
// as Reload does. trigger says what asked, in the log. Every outcome is logged and
// counted, a config that could not be read or parsed included (sluice_reloads_total,
// sluice_config_last_reload_successful, and the time of the last success).
func (s *Server) ReloadFrom(trigger string, load func() (Config, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg, err := load()
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		if ignored := keepStartOnly(&cfg, s.cfg); len(ignored) > 0 {
			s.log.Warn("reload: settings read at start only are kept until a restart", "trigger", trigger, "settings", ignored)
		}
		err = s.apply(cfg)
	}
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		s.m.reloadOK.Set(0)
		s.log.Error("reload refused; the old config stays", "trigger", trigger, "err", err)
		return err
	}
	s.m.reloads.WithLabelValues("ok").Inc()
	s.m.reloadOK.Set(1)
	s.m.reloadTime.Set(float64(time.Now().UnixNano()) / 1e9)
	s.log.Info("reloaded", "trigger", trigger, "rules", len(cfg.Rules), "default", cfg.Default != nil)
	return nil
}

// keepStartOnly sets cfg's start-only settings to those of the running config, and
// returns the names of those cfg would have changed.
func keepStartOnly(cfg *Config, running Config) []string {
	var ignored []string
	keep := func(name string, changed bool) {
		if changed {
			ignored = append(ignored, name)
		}
	}
	keep("listen_line", cfg.ListenLine != running.ListenLine)
	keep("listen_http", cfg.ListenHTTP != running.ListenHTTP)
	keep("listen_admin", cfg.ListenAdmin != running.ListenAdmin)
	keep("listen_grpc", cfg.ListenGRPC != running.ListenGRPC)
	keep("grpc.max_message, grpc.max_streams, grpc.reflection, grpc.transport", cfg.GRPC.MaxMessage != running.GRPC.MaxMessage ||
		cfg.GRPC.MaxStreams != running.GRPC.MaxStreams || cfg.GRPC.Reflection != running.GRPC.Reflection ||
		cfg.GRPC.Transport != running.GRPC.Transport)
	cfg.GRPC.MaxMessage, cfg.GRPC.MaxStreams, cfg.GRPC.Reflection = running.GRPC.MaxMessage, running.GRPC.MaxStreams, running.GRPC.Reflection
	cfg.GRPC.Transport = running.GRPC.Transport
	cfg.ListenGRPC = running.ListenGRPC
	keep("backend", cfg.Backend != running.Backend)
	keep("redis_url", cfg.RedisURL != running.RedisURL)
	keep("store", cfg.Store != running.Store)
	keep("redis_timeout", cfg.RedisTimeout != running.RedisTimeout)
	keep("redis_replica_acks", cfg.RedisAcks != running.RedisAcks)
	keep("fail_mode", cfg.FailMode != running.FailMode)
	keep("fallback_share", cfg.FallbackShare != running.FallbackShare)
	keep("max_keys", cfg.MaxKeys != running.MaxKeys)
	keep("log_format", cfg.LogFormat != running.LogFormat)
	keep("log_level", cfg.LogLevel != running.LogLevel)
	keep("gossip", !reflect.DeepEqual(cfg.Gossip, running.Gossip))
	// The gossip back end learns each rule's own policy at start (GossipPolicies).
	keep("rules' gossip", !maps.Equal(gossipByRule(cfg.Rules), gossipByRule(running.Rules)))
	cfg.Gossip = running.Gossip
	cfg.ListenLine, cfg.ListenHTTP, cfg.ListenAdmin = running.ListenLine, running.ListenHTTP, running.ListenAdmin
	cfg.Backend, cfg.RedisURL, cfg.Store = running.Backend, running.RedisURL, running.Store
	cfg.RedisTimeout, cfg.FailMode, cfg.FallbackShare, cfg.MaxKeys = running.RedisTimeout, running.FailMode, running.FallbackShare, running.MaxKeys
	cfg.RedisAcks = running.RedisAcks
	cfg.LogFormat, cfg.LogLevel = running.LogFormat, running.LogLevel
	return ignored
}

// gossipByRule is each rule's own gossip policy (Rule.Gossip), by the rule's name.
func gossipByRule(rules []Rule) map[string]string {
	m := map[string]string{}
	for _, r := range rules {
		if r.Gossip != "" {
			name := r.Name
			if name == "" {
				name = r.Match
			}
			m[name] = r.Gossip
		}
	}
	return m
}
