package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// The deploy/ files cannot be run here as they would be (no container engine, no
// cluster, no systemd as PID 1): these tests run what they hold through the binary
// instead: each one's arguments and config through `sluice serve --check-config`, and
// the Kubernetes container's as a real daemon whose probes are asked.

// k8sObject is the part of a manifest the tests read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Selector yaml.Node `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		Ports []struct {
			Name       string `yaml:"name"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Args []string `yaml:"args"`
	Env  []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

func loadManifests(t *testing.T) map[string]k8sObject {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o k8sObject
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("deploy/kubernetes/sluice.yaml: %v", err)
		}
		objs[o.Kind] = o
	}
	for _, k := range []string{"Namespace", "ConfigMap", "DaemonSet", "Service", "NetworkPolicy"} {
		if _, ok := objs[k]; !ok {
			t.Fatalf("deploy/kubernetes/sluice.yaml has no %s", k)
		}
	}
	return objs
}

// checkConfig runs `sluice serve --check-config` with args and env; it fails the test
// unless the config would start.
func checkConfig(t *testing.T, what string, args, env []string) {
	t.Helper()
	cmd := exec.Command(binary, append(args, "--check-config")...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok:") {
		t.Errorf("%s: sluice %s --check-config: %v\n%s", what, strings.Join(args, " "), err, out)
	}
	if bytes.Contains(out, []byte("WARN")) {
		t.Errorf("%s: the config draws warnings:\n%s", what, out)
	}
}

// TestKubernetesManifests: the DaemonSet's container arguments and environment, with the
// ConfigMap's config where it mounts it, pass --check-config, and start a daemon whose
// probes answer 200 on the port they name; the Service finds the DaemonSet's pods.
func TestKubernetesManifests(t *testing.T) {
	objs := loadManifests(t)
	ds, cm, svc := objs["DaemonSet"], objs["ConfigMap"], objs["Service"]
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	// The ConfigMap's file where the container reads it.
	dir := t.TempDir()
	var mount string
	for _, vm := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap.Name == cm.Metadata.Name {
				mount = vm.MountPath
			}
		}
	}
	if mount == "" {
		t.Fatal("the container does not mount the ConfigMap")
	}
	for name, text := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = strings.Replace(a, mount, dir, 1)
	}
	env := map[string]string{}
	var envList []string
	for _, e := range c.Env {
		env[e.Name] = e.Value
		envList = append(envList, e.Name+"="+e.Value)
	}
	checkConfig(t, "DaemonSet", args, envList)

	// Run it, on free loopback ports in place of the pod's, and ask what the kubelet asks.
	ports := map[string]string{} // port name -> the address the test uses
	for _, p := range c.Ports {
		for k, v := range env {
			if strings.HasSuffix(v, ":"+strconv.Itoa(p.ContainerPort)) {
				addr := proctest.FreeAddr(t)
				ports[p.Name] = addr
				env[k] = addr
			}
		}
	}
	envList = envList[:0]
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}
	if env["SLUICE_LISTEN_HTTP"] != "" && !strings.HasPrefix(env["SLUICE_LISTEN_HTTP"], "127.0.0.1:") {
		t.Errorf("the HTTP API listens on %s: want the pod's loopback", env["SLUICE_LISTEN_HTTP"])
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), append(envList, "SLUICE_LISTEN_HTTP="+proctest.FreeAddr(t))...)
	var logs bytes.Buffer
	cmd.Stderr, cmd.Stdout = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for _, p := range []k8sProbe{c.LivenessProbe, c.ReadinessProbe} {
		addr, ok := ports[p.HTTPGet.Port]
		if !ok || p.HTTPGet.Path == "" {
			t.Fatalf("a probe asks %q on port %q, which the container does not declare", p.HTTPGet.Path, p.HTTPGet.Port)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + p.HTTPGet.Path)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("probe %s on %s: %v %v\n%s", p.HTTPGet.Path, addr, resp, err, logs.String())
			}
			time.Sleep(20 * time.Millisecond) // wait for the condition: the daemon listens
		}
	}
	if got := query(t, ports["line"], "api\n"); got != "OK\n" {
		t.Errorf("the line protocol on the line port: %q", got)
	}
	// The Service selects the pods, and targets ports the container has.
	var sel struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := ds.Spec.Selector.Decode(&sel); err != nil {
		t.Fatal(err)
	}
	var svcSel map[string]string
	if err := svc.Spec.Selector.Decode(&svcSel); err != nil {
		t.Fatal(err)
	}
	for k, v := range svcSel {
		if ds.Spec.Template.Metadata.Labels[k] != v || sel.MatchLabels[k] != v {
			t.Errorf("the Service selects %s=%s, which the DaemonSet's pods do not carry", k, v)
		}
	}
	for _, p := range svc.Spec.Ports {
		if _, ok := ports[p.TargetPort]; !ok {
			t.Errorf("the Service targets port %q, which the container does not declare", p.TargetPort)
		}
	}
}

// TestDockerfile: the image is static and non-root, and its default command, with the
// Kubernetes ConfigMap's config where it reads it, passes --check-config. (There is no
// container engine here to build it.)
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "FROM gcr.io/distroless/static", "USER nonroot"} {
		if !strings.Contains(text, want) {
			t.Errorf("deploy/Dockerfile lacks %q", want)
		}
	}
	var cmd []string
	if m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(text); m == nil {
		t.Fatal("deploy/Dockerfile has no CMD in its JSON form")
	} else if err := json.Unmarshal([]byte(m[1]), &cmd); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(loadManifests(t)["ConfigMap"].Data["sluice.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, a := range cmd {
		cmd[i] = strings.Replace(a, "/etc/sluice/sluice.yaml", cfg, 1)
	}
	checkConfig(t, "Dockerfile CMD", cmd, nil)
}

// TestSystemdUnit: every sluice command line of the unit, with a config where it reads
// one, passes --check-config.
func TestSystemdUnit(t *testing.T) {
	f, err := os.Open("../../deploy/systemd/sluice.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(loadManifests(t)["ConfigMap"].Data["sluice.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	// The token as systemd hands it over: a credential in $CREDENTIALS_DIRECTORY.
	creds := filepath.Join(dir, "credentials")
	if err := os.Mkdir(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(creds, "http-token"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, loads := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, cmdline, ok := strings.Cut(sc.Text(), "=")
		if key == "LoadCredential" && strings.HasPrefix(cmdline, "http-token:") {
			loads = true
		}
		if !ok || !strings.HasPrefix(key, "Exec") || !strings.HasPrefix(cmdline, "/usr/local/bin/sluice ") {
			continue
		}
		if !strings.Contains(cmdline, "--http-token-file ${CREDENTIALS_DIRECTORY}/http-token") {
			t.Errorf("%s does not read the token from its credential: %s", key, cmdline)
		}
		cmdline = strings.ReplaceAll(cmdline, "${CREDENTIALS_DIRECTORY}", creds)
		args := strings.Fields(strings.Replace(cmdline, "/etc/sluice/sluice.yaml", cfg, 1))[1:]
		if i := slices.Index(args, "--check-config"); i >= 0 {
			args = append(args[:i], args[i+1:]...)
		}
		checkConfig(t, key, args, nil)
		n++
	}
	if n < 2 {
		t.Errorf("found %d sluice command lines in the unit, want ExecStart and its checks", n)
	}
	if !loads {
		t.Error("the unit loads no http-token credential (LoadCredential=http-token:...)")
	}
}

// TestKubernetesPolicyAndRollout: the NetworkPolicy selects the daemons and lets through
// the container's line and admin ports only; the DaemonSet rolls a node over without a gap
// (maxSurge 1, maxUnavailable 0: a node's clients reach only their node's daemon); the
// image is one the user names (nothing is published), not a registry's latest.
func TestKubernetesPolicyAndRollout(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		docs[d["kind"].(string)] = d
	}
	get := func(v any, path ...string) any {
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[p]
		}
		return v
	}
	np := docs["NetworkPolicy"]
	if get(np, "spec", "podSelector", "matchLabels", "app.kubernetes.io/name") != "sluice" {
		t.Errorf("the NetworkPolicy does not select the daemons: %v", get(np, "spec", "podSelector"))
	}
	var ports []string
	for _, rule := range get(np, "spec", "ingress").([]any) {
		if get(rule, "from") == nil {
			t.Errorf("an ingress rule from anywhere: %v", rule)
		}
		for _, p := range get(rule, "ports").([]any) {
			ports = append(ports, get(p, "port").(string))
		}
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []string{"admin", "line"}) {
		t.Errorf("the NetworkPolicy lets through ports %v, want admin and line", ports)
	}
	ru := get(docs["DaemonSet"], "spec", "updateStrategy", "rollingUpdate")
	if get(ru, "maxSurge") != 1 || get(ru, "maxUnavailable") != 0 {
		t.Errorf("rolling update %v: want maxSurge 1 and maxUnavailable 0", ru)
	}
	c := get(docs["DaemonSet"], "spec", "template", "spec", "containers").([]any)[0]
	if img := get(c, "image").(string); strings.HasSuffix(img, ":latest") || strings.HasPrefix(img, "ghcr.io/") {
		t.Errorf("image %q: nothing is published; the manifest names the user's own", img)
	}
}
