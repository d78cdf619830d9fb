package sim

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// chromium runs headless Chromium (Debian's chromium package) on a page, offline (every
// host name resolves to nothing), with a fresh profile, and returns what it printed and
// the console messages it logged: the page's errors, and anything else it wrote there.
func chromium(t *testing.T, page string, args ...string) (stdout string, console []string) {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("headless Chromium is needed: apt-get install -y chromium (Debian), or scripts/test-deps")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=" + t.TempDir(),
		"--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0"}, args...)
	cmd := exec.CommandContext(ctx, bin, append(args, "file://"+page)...)
	// Chromium starts processes of its own: a group, killed together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err = cmd.Run()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever outlived it
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, errs.String())
	}
	for _, l := range strings.Split(errs.String(), "\n") {
		if strings.Contains(l, ":CONSOLE") {
			console = append(console, l)
		}
	}
	return out.String(), console
}

// TestChromiumReportsConsoleErrors: the harness sees a page's console errors (else the
// report's test below would pass on any page).
func TestChromiumReportsConsoleErrors(t *testing.T) {
	t.Parallel() // a browser of its own, mostly waited on
	page := filepath.Join(t.TempDir(), "bad.html")
	if err := os.WriteFile(page, []byte(`<!DOCTYPE html><html><body><p>x</p><script>nope();</script></body></html>`), 0o644); err != nil {
		t.Fatal(err)
	}
	dom, console := chromium(t, page, "--dump-dom")
	if !strings.Contains(dom, "<p>x</p>") {
		t.Errorf("the DOM: %q", dom)
	}
	if len(console) != 1 || !strings.Contains(console[0], "nope is not defined") {
		t.Errorf("console %q, want the page's ReferenceError", console)
	}
}

// TestHTMLReportInChromium: the report is one page that fetches nothing, and headless
// Chromium renders it without a console message: a section per mode with its figure
// (an SVG data URI), the side-by-side table with a column per mode, and the figures drawn
// (the admitted rate's blue on the screenshot).
func TestHTMLReportInChromium(t *testing.T) {
	t.Parallel()
	modes := []string{"local", "strict", "lease"}
	r, err := Run(parse(t, plotOutage), Options{Modes: modes})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*"?(https?:)?//`).Match(buf.Bytes()) {
		t.Error("the report refers to something on the network")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	dom, console := chromium(t, page, "--dump-dom")
	if len(console) > 0 {
		t.Errorf("console messages: %q", console)
	}
	head := regexp.MustCompile(`<thead><tr><th></th>(.*?)</tr></thead>`).FindStringSubmatch(dom)
	if head == nil || head[1] != `<th class="n">local</th><th class="n">strict</th><th class="n">lease</th>` {
		t.Errorf("the side-by-side table's head: %q", head)
	}
	for _, m := range modes {
		sec := regexp.MustCompile(`<section class="mode" id="mode-` + m + `">\s*<h2>` + m + `</h2>\s*(<p class="models">[^<]*</p>\s*)?<p><img class="figure" alt="[^"]*" src="data:image/svg\+xml;base64,`)
		if !sec.MatchString(dom) {
			t.Errorf("no section for %s with its figure", m)
		}
	}
	if !strings.Contains(dom, `<p class="models">local: one process`) {
		t.Error("the local mode's section does not say what it simulates")
	}
	if n := strings.Count(dom, "store outage for 10s"); n < 3 {
		t.Errorf("the outage in %d places, want the table's row and each mode's events", n)
	}

	shot := filepath.Join(dir, "shot.png")
	_, console = chromium(t, page, "--hide-scrollbars", "--window-size=1400,3000", "--screenshot="+shot)
	if len(console) > 0 {
		t.Errorf("console messages: %q", console)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The admitted rate's blue: only the figures draw it, each mode's its own line.
	b := img.Bounds()
	blue := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if d := absDiff(r>>8, colAdmitted.R) + absDiff(g>>8, colAdmitted.G) + absDiff(bl>>8, colAdmitted.B); d < 60 {
				blue++
			}
		}
	}
	if blue < 3*300 {
		t.Errorf("%d pixels of the admitted rate's blue on the page, want at least 300 for each of the 3 figures", blue)
	}
}

func absDiff(a uint32, b uint8) int { return max(int(a)-int(b), int(b)-int(a)) }

// TestPlotLegendFitsInChromium: the figure's legend, as headless Chromium lays it out
// (the SVG inline in a page, each text's rendered width measured by the page's script):
// no legend text runs over its line sample. The figure is laid out with the metrics of
// its own font; a browser that has not that font draws the text in another, wider one,
// unless the SVG carries it.
func TestPlotLegendFitsInChromium(t *testing.T) {
	t.Parallel()
	r, err := Run(parse(t, plotOutage), Options{Modes: []string{"strict"}})
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := r.WritePlot(&svg, "svg"); err != nil {
		t.Fatal(err)
	}
	body := svg.String()
	body = body[strings.Index(body, "<svg"):]
	// Each legend entry of the rate and queue panels is a sample (a 20-unit horizontal
	// line) and its text just before it; the script finds them in the rendered page and
	// reports, for each text, by how much its right end passes the sample's left end (in
	// the SVG's units). (The members' panel's samples are glyphs, laid out alike.)
	const script = `<script>
window.addEventListener('load', () => {
  const out = [];
  const paths = [...document.querySelectorAll('svg path')];
  for (const t of document.querySelectorAll('svg text')) {
    const name = t.textContent;
    if (!['admitted', 'limit', '429s', 'events', 'queued'].includes(name)) continue;
    const y = -parseFloat(t.getAttribute('y'));
    const x = parseFloat(t.getAttribute('x'));
    const sample = paths.find(p => {
      const m = /^M([\d.]+),([\d.]+)L([\d.]+),([\d.]+)$/.exec(p.getAttribute('d'));
      return m && Math.abs(parseFloat(m[2]) - y) < 6 && m[2] === m[4] && Math.abs(parseFloat(m[3]) - parseFloat(m[1]) - 20) < 0.5 && parseFloat(m[1]) > x;
    });
    if (!sample) { out.push(name + ' nosample'); continue; }
    const left = parseFloat(/^M([\d.]+)/.exec(sample.getAttribute('d'))[1]);
    out.push(name + ' ' + (x + t.getComputedTextLength() - left).toFixed(2));
  }
  const pre = document.createElement('pre');
  pre.id = 'legend';
  pre.textContent = out.join('\n');
  document.body.appendChild(pre);
});
</script>`
	page := filepath.Join(t.TempDir(), "plot.html")
	if err := os.WriteFile(page, []byte("<!doctype html><html><body>"+body+script+"</body></html>"), 0o644); err != nil {
		t.Fatal(err)
	}
	dom, console := chromium(t, page, "--dump-dom")
	if len(console) > 0 {
		t.Errorf("console messages: %q", console)
	}
	m := regexp.MustCompile(`(?s)<pre id="legend">(.*?)</pre>`).FindStringSubmatch(dom)
	if m == nil || strings.TrimSpace(m[1]) == "" {
		t.Fatalf("the page measured no legend: %q", dom[max(0, len(dom)-300):])
	}
	lines := strings.Split(strings.TrimSpace(m[1]), "\n")
	if len(lines) < 5 {
		t.Errorf("the page measured %d legend entries, want the 5 of the rate and queue panels: %q", len(lines), lines)
	}
	for _, l := range lines {
		name, over, _ := strings.Cut(l, " ")
		if over == "nosample" {
			t.Errorf("legend %q: no line sample beside it", name)
			continue
		}
		var d float64
		fmt.Sscan(over, &d)
		if d > 0 {
			t.Errorf("legend %q runs %.2f units over its line sample in Chromium", name, d)
		}
	}
}
