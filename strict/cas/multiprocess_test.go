package cas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// workerEnv, when set, makes the test binary a worker process of TestProcessesShareALimit
// (see TestMain): its value is the worker's JSON config.
const workerEnv = "SLUICE_CAS_WORKER"

type workerConfig struct {
	Store    string        `json:"store"` // "etcd" or "zk"
	Addr     string        `json:"addr"`
	Path     string        `json:"path"` // the store's prefix or path
	T        int64         `json:"t"`
	Tau      int64         `json:"tau"`
	Duration time.Duration `json:"duration"`
}

// workerMain is one worker process: a member (its own client, store and backend) with two
// goroutines taking permits, printing the store time of each grant, one a line.
func workerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	var st store.Store
	switch cfg.Store {
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{cfg.Addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
		defer c.Close()
		st = etcdstore.New(c, store.WithPrefix(cfg.Path+"/"))
	case "zk":
		c, _, err := zk.Connect([]string{cfg.Addr}, 4*time.Second, zk.WithLogger(zktest.Quiet{}))
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
		defer c.Close()
		st = zkstore.New(c, store.WithPrefix(cfg.Path))
	}
	b := New(st, WithTimeout(2*time.Second))
	defer b.Close()
	at := runMembers(func(a ...any) { fmt.Fprintln(os.Stderr, a...) }, []*Backend{b}, gcra.Limit{T: cfg.T, Tau: cfg.Tau}, cfg.Duration)
	var out strings.Builder
	for _, t := range at {
		fmt.Fprintln(&out, t)
	}
	os.Stdout.WriteString(out.String())
	return 0
}

// TestProcessesShareALimit: three OS processes (the test binary re-executed), one member
// each, share 50/s burst=5 through a real etcd and a real ZooKeeper for two seconds.
// Judged exactly on the store's time of each grant, none breaks the limit.
func TestProcessesShareALimit(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: not in -short")
	}
	l := gcra.Limit{T: int64(20 * time.Millisecond), Tau: int64(100 * time.Millisecond)}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"etcd", "zk"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel() // each store its own server
			cfg := workerConfig{Store: store, Path: unique("/procs"), T: l.T, Tau: l.Tau, Duration: 2 * time.Second}
			if store == "etcd" {
				cfg.Addr = sharedEtcd(t).Addr()
			} else {
				cfg.Addr = sharedZK(t).Addr()
			}
			js, _ := json.Marshal(cfg)
			outs := make([]bytes.Buffer, 3)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for p := range outs {
				cmd := exec.Command(exe, "-test.run", "^$")
				cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
				cmd.Stdout = &outs[p]
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				wg.Add(1)
				go func() {
					defer wg.Done()
					if errs[p] = cmd.Run(); errs[p] != nil {
						errs[p] = fmt.Errorf("%w: %s", errs[p], stderr.String())
					}
				}()
			}
			wg.Wait()
			var at []int64
			for p, out := range outs {
				if errs[p] != nil {
					t.Fatalf("worker %d: %v", p, errs[p])
				}
				n := 0
				for _, line := range strings.Fields(out.String()) {
					v, err := strconv.ParseInt(line, 10, 64)
					if err != nil {
						t.Fatalf("worker %d printed %q", p, line)
					}
					at = append(at, v)
					n++
				}
				if n == 0 {
					t.Errorf("worker %d made no grant", p)
				}
			}
			judgeGrants(t, at, l)
		})
	}
}
