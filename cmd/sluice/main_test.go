package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// These tests run the real binary as separate OS processes and talk to it over real
// sockets and signals.

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type daemon struct {
	cmd        *exec.Cmd
	line, http string
	log        *bytes.Buffer
	logMu      *sync.Mutex
	done       chan error
}

type syncWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	d := &daemon{line: proctest.FreeAddr(t), http: proctest.FreeAddr(t), log: &bytes.Buffer{}, logMu: &sync.Mutex{}, done: make(chan error, 1)}
	d.cmd = exec.Command(binary, append([]string{"serve", "--listen-line", d.line, "--listen-http", d.http}, args...)...)
	d.cmd.Stderr = syncWriter{d.logMu, d.log}
	d.cmd.Stdout = d.cmd.Stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get("http://" + d.http + "/healthz"); err == nil {
			resp.Body.Close()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not start: %s", d.logs())
		}
		time.Sleep(20 * time.Millisecond) // wait for the condition: the daemon listens
	}
}

func (d *daemon) logs() string { d.logMu.Lock(); defer d.logMu.Unlock(); return d.log.String() }

// load is workers querying one tag on the daemon, each on its own connection (see worker).
type load struct {
	stop     chan struct{}
	errs     chan error // one error (nil: stopped cleanly) per worker when it ends
	answered atomic.Int64
}

// startLoad starts n workers querying tag at addr.
func startLoad(t *testing.T, addr, tag string, n int) *load {
	l := &load{stop: make(chan struct{}), errs: make(chan error, n)}
	for i := 0; i < n; i++ {
		go worker(t, addr, tag, l.stop, &l.answered, l.errs)
	}
	return l
}

// await waits until n more queries have been answered.
func (l *load) await(n int64) {
	for target := l.answered.Load() + n; l.answered.Load() < target; {
		time.Sleep(time.Millisecond)
	}
}

// worker queries tag over one connection, one query at a time, until stop; it counts
// answers and fails on anything but OK or NO.
func worker(t *testing.T, addr, tag string, stop <-chan struct{}, answered *atomic.Int64, errs chan<- error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		errs <- err
		return
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		select {
		case <-stop:
			errs <- nil
			return
		default:
		}
		if _, err := c.Write([]byte(tag + "\n")); err != nil {
			errs <- fmt.Errorf("write: %w", err)
			return
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := r.ReadString('\n')
		if err != nil {
			errs <- fmt.Errorf("read after %d answers: %w", answered.Load(), err)
			return
		}
		if line != "OK\n" && line != "NO\n" {
			errs <- fmt.Errorf("malformed answer %q", line)
			return
		}
		answered.Add(1)
	}
}

// send dials addr, writes in, and gives the answers 5 seconds to come.
func send(t *testing.T, addr, in string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte(in))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return c
}

func query(t *testing.T, addr, in string) string {
	t.Helper()
	c := send(t, addr, in)
	defer c.Close()
	buf := make([]byte, 3*strings.Count(in, "\n"))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("query %q: %v", in, err)
	}
	return string(buf)
}

// queryLine sends one query and reads its answer line, whatever its length.
func queryLine(t *testing.T, addr, in string) string {
	t.Helper()
	c := send(t, addr, in)
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("query %q: %v", in, err)
	}
	return line
}

// TestServeReloadUnderLoad: SIGHUP swaps the rules while clients keep querying: no
// connection is lost, no query unanswered, and buckets of rules that stay keep their state.
func TestServeReloadUnderLoad(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	os.WriteFile(cfg, []byte("rules:\n  - {match: kept, limit: 1/h}\n  - {match: load, limit: 1000/s}\n"), 0o644)
	d := startDaemon(t, "--config", cfg)
	if got := query(t, d.line, "kept\nkept\n"); got != "OK\nNO\n" {
		t.Fatalf("before: %q", got)
	}
	ld := startLoad(t, d.line, "load", 8)
	ld.await(200)
	os.WriteFile(cfg, []byte("rules:\n  - {match: kept, limit: 1/h}\n  - {match: load, limit: 5/s}\n  - {match: fresh, limit: 1/h}\n"), 0o644)
	d.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.logs(), "reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged: %s", d.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ld.await(200)
	close(ld.stop)
	for i := 0; i < 8; i++ {
		if err := <-ld.errs; err != nil {
			t.Errorf("a client during the reload: %v", err)
		}
	}
	if got := query(t, d.line, "kept\nfresh\nfresh\n"); got != "NO\nOK\nNO\n" {
		t.Errorf("after the reload: %q: the kept bucket must stay drained, the new rule must apply", got)
	}
	// A broken config is refused and the old one stays.
	os.WriteFile(cfg, []byte("rules: [{match: x, limit: ten}]\n"), 0o644)
	d.cmd.Process.Signal(syscall.SIGHUP)
	for !strings.Contains(d.logs(), "reload refused") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged: %s", d.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(d.logs(), "sluice.yaml:1:") {
		t.Errorf("the refusal does not name the file and line: %s", d.logs())
	}
	if got := query(t, d.line, "fresh\n"); got != "NO\n" {
		t.Errorf("after a refused reload: %q", got)
	}
}

// TestServeSIGTERMUnderLoad: SIGTERM under load: every client gets well-formed answers up
// to an orderly close, and the daemon exits 0 within a few seconds.
func TestServeSIGTERMUnderLoad(t *testing.T) {
	d := startDaemon(t, "--limit", "load=100000/s")
	ld := startLoad(t, d.line, "load", 8)
	ld.await(500)
	start := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("the daemon exited with %v: %s", err, d.logs())
		}
		d.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatalf("the daemon did not exit within 10s of SIGTERM: %s", d.logs())
	}
	if el := time.Since(start); el > 6*time.Second {
		t.Errorf("exit took %v", el)
	}
	close(ld.stop)
	for i := 0; i < 8; i++ {
		// Each client ends on a read or write error once the daemon closes: what matters is
		// that no answer was malformed (worker reports that as an "answer" error).
		if err := <-ld.errs; err != nil && strings.Contains(err.Error(), "malformed") {
			t.Errorf("a client: %v", err)
		}
	}
	if !strings.Contains(d.logs(), "stopped") {
		t.Errorf("no orderly stop logged: %s", d.logs())
	}
}

// waitLog waits until the daemon has logged s n times.
func (d *daemon) waitLog(t *testing.T, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(d.logs(), s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%q was not logged %d times: %s", s, n, d.logs())
		}
		time.Sleep(10 * time.Millisecond) // wait for the condition
	}
}

// TestServeReloadsWhenTheFileChanges: a new config file (replaced by a rename, as the
// kubelet updates a ConfigMap) is reloaded without a SIGHUP; a broken one is refused and
// counted in /metrics; the environment sets what the file does not (flags over the
// environment over the file).
func TestServeReloadsWhenTheFileChanges(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	write := func(text string) {
		tmp := filepath.Join(dir, "next.yaml")
		os.WriteFile(tmp, []byte(text), 0o644)
		if err := os.Rename(tmp, cfg); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - {match: api, limit: 1/h}\n")
	t.Setenv("SLUICE_LIMIT", "env=1/h\nenv-*=2/h")
	t.Setenv("SLUICE_WATCH_CONFIG", "20ms")
	d := startDaemon(t, "--config", cfg)
	if got := query(t, d.line, "api\napi\nenv\nenv\nenv-1\n"); got != "OK\nNO\nOK\nNO\nOK\n" {
		t.Fatalf("before: %q", got)
	}
	write("rules:\n  - {match: api, limit: 1/h}\n  - {match: fresh, limit: 1/h}\n")
	d.waitLog(t, `trigger="the config file changed"`, 1)
	if got := query(t, d.line, "api\nfresh\nfresh\n"); got != "NO\nOK\nNO\n" {
		t.Errorf("after the change: %q: the api bucket stays drained, the new rule applies", got)
	}
	write("rules: [\n")
	d.waitLog(t, "reload refused", 1)
	resp, err := http.Get("http://" + d.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_reloads_total{result="error"} 1`, `sluice_reloads_total{result="ok"} 1`, "sluice_config_last_reload_successful 0"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	time.Sleep(100 * time.Millisecond) // five more looks at the unchanged broken file
	if n := strings.Count(d.logs(), "reload refused"); n != 1 {
		t.Errorf("an unchanged file was reloaded again: %d refusals", n)
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(cfg, []byte("rules:\n  - match: api\n    limit: 10 per second\n"), 0o644)
	out, err := exec.Command(binary, "serve", "--config", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2", err)
	}
	if !strings.Contains(string(out), "bad.yaml:3:") {
		t.Errorf("the error does not name file and line: %s", out)
	}
}

// TestServeSeveralDaemonsShareOneRedis: three daemons, separate processes, one real Redis.
// Clients load all three with stamped queries; every grant's slot (Redis' time of the
// decision) is recorded, and together they conform to the limit exactly.
func TestServeSeveralDaemonsShareOneRedis(t *testing.T) {
	srv := redistest.New(t)
	const limit = "50/s burst=5"
	var daemons []*daemon
	for i := 0; i < 3; i++ {
		daemons = append(daemons, startDaemon(t, "--backend", "strict", "--store", srv.URL(), "--limit", "api="+limit))
	}
	var mu sync.Mutex
	var slots []int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for _, d := range daemons {
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func(addr string) {
				defer wg.Done()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				r := bufio.NewReader(c)
				for time.Now().Before(stop) {
					c.Write([]byte("~T api\n"))
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					line, err := r.ReadString('\n')
					if err != nil {
						t.Error(err)
						return
					}
					if at, ok := strings.CutPrefix(strings.TrimSpace(line), "OK at="); ok {
						var ns int64
						fmt.Sscan(at, &ns)
						mu.Lock()
						slots = append(slots, ns)
						mu.Unlock()
					} else if line != "NO\n" {
						t.Errorf("answer %q", line)
						return
					}
				}
			}(d.line)
		}
	}
	wg.Wait()
	slices.Sort(slots)
	ls := sluice.MustParse(limit)
	tats := make([]int64, len(ls))
	for i, at := range slots {
		if r, _, _ := gcra.Decide(tats, limitconv.Core(ls, 0), at, 1, 0); !r.Allowed {
			t.Fatalf("grant %d of %d, at %d, breaks %s", i, len(slots), at, limit)
		}
	}
	// Liveness, loosely: over about 2 s, 5 + 50×2 = 105 could be granted.
	if len(slots) < 60 {
		t.Errorf("%d grants in 2 s across three daemons, want most of 105", len(slots))
	}
	t.Logf("%d grants across 3 daemons, all conforming to %s", len(slots), limit)
}

// TestServeRedisDown: a daemon whose Redis is down still starts and answers by its fail
// mode, and says it is not ready; once Redis is back it is ready and decides there.
func TestServeRedisDown(t *testing.T) {
	srv := redistest.New(t)
	srv.Kill()
	d := startDaemon(t, "--backend", "strict", "--store", srv.URL(), "--limit", "api=1/h", "--fail-mode", "closed")
	resp, err := http.Get("http://" + d.http + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz with Redis down: %d, want 503", resp.StatusCode)
	}
	if got := query(t, d.line, "api\n"); got != "NO\n" {
		t.Errorf("fail closed with Redis down: %q", got)
	}
	// The denial says when to ask again (the prober's interval), not 0.
	if got := queryLine(t, d.line, "~v api\n"); !strings.HasPrefix(got, "NO a=100 ") {
		t.Errorf("the answer with Redis down: %q, want a retry hint of 100ms", got)
	}
	// The daemon logs the outage as it happens, apart from its answers: wait for the line
	// (CI read the log once before it was written).
	d.waitLog(t, "backend unavailable", 1)
	if n := strings.Count(d.logs(), "backend unavailable"); n != 1 || !strings.Contains(d.logs(), "fail_mode=closed") {
		t.Errorf("Redis down at start: logged %d times, want once with the fail mode: %s", n, d.logs())
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	d.waitLog(t, "backend available again", 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + d.http + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready after Redis came back: %s", d.logs())
		}
		time.Sleep(50 * time.Millisecond) // wait for the condition
	}
	for {
		if got := query(t, d.line, "api\n"); got == "OK\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never decided in Redis after it came back: %s", d.logs())
		}
		time.Sleep(50 * time.Millisecond) // the breaker's probe runs on its own period
	}
	if got := query(t, d.line, "api\n"); got != "NO\n" {
		t.Errorf("1/h twice: %q", got)
	}
}
