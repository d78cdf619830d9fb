package lease

// Test hooks for the external tests (package lease_test).

var (
	SharedEtcd  = sharedEtcd
	SharedZK    = sharedZK
	CloseShared = closeShared
	EtcdClient  = etcdClient
	ZKClient    = zkClient
	ZKSession   = zkSession
	ZKDelete    = zkDeleteTree
)
