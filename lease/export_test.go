package lease

// Test hooks for the external tests (package lease_test).
var WithRedisNow = withRedisNow

// AssumeFresh makes s answer as a store that knows no lease was granted before.
func AssumeFresh(s *RedisStore) { s.assumeFresh = true }

var (
	WithEtcdNow = withEtcdNow
	SharedEtcd  = sharedEtcd
	SharedZK    = sharedZK
	CloseShared = closeShared
	EtcdClient  = etcdClient
	WithZKNow   = withZKNow
	ZKClient    = zkClient
	ZKSession   = zkSession
	ZKDelete    = zkDeleteTree
)
