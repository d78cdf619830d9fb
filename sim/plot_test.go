package sim

import (
	"bytes"
	"encoding/xml"
	"image/color"
	"image/png"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// plotOutage is a short store outage under load, in two modes: the figure's test scenario.
const plotOutage = `
name: outage
duration: 1m
seed: 1
limit: 100/s burst=20
modes: [strict, local]
sample: 1s
network:
  store: {latency: {dist: uniform, min: 500us, max: 2ms}}
  api: {latency: {dist: uniform, min: 5ms, max: 15ms}}
store: {timeout: 50ms}
client: {max_wait: 1s, margin: 12ms, backoff: {base: 20ms, max: 1s, jitter: 0.5}}
members:
  - name: m
    count: 10
    goroutines: 4
    demand: {pattern: poisson, rate: 12}
events:
  - {at: 20s, store_outage: 10s}
  - {at: 40s, crash: m1}
`

// svgTexts reads an SVG's root size and every text element's content.
func svgTexts(t *testing.T, b []byte) (width, height string, texts []string) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	inText := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch x := tok.(type) {
		case xml.StartElement:
			if x.Name.Local == "svg" {
				for _, a := range x.Attr {
					switch a.Name.Local {
					case "width":
						width = a.Value
					case "height":
						height = a.Value
					}
				}
			}
			inText = x.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(x))
			}
		case xml.EndElement:
			inText = false
		}
	}
}

// TestPlotSVGStructure: the figure is one SVG, 14 by 8.5 inches for two modes, with a
// row of panels per mode: the rate panel titled with the mode and its figures, the
// legend's entries, the axes' units, each event labelled, the queue and the members'
// panels; the same report draws the same bytes.
func TestPlotSVGStructure(t *testing.T) {
	r, err := Run(parse(t, plotOutage), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if err := r.WritePlot(&a, "svg"); err != nil {
		t.Fatal(err)
	}
	if err := r.WritePlot(&b, "svg"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two drawings of one report differ")
	}
	w, h, texts := svgTexts(t, a.Bytes())
	if w != "1008pt" || h != "612pt" {
		t.Errorf("size %s x %s, want 1008pt x 612pt (14 x 8.5 in)", w, h)
	}
	count := func(want string) int {
		n := 0
		for _, s := range texts {
			if strings.Contains(s, want) {
				n++
			}
		}
		return n
	}
	for want, n := range map[string]int{
		"outage: 10 members, limit 100/s burst=20": 1,
		"strict: ": 1, "local: ": 1, "admitted, ": 2, // the rate panels' titles
		"requests/s": 2, "time (s)": 4, "admitted": 4, "limit": 3, "429s": 2, "events": 2,
		"store outage for 10s": 2, "crash m1": 2,
		"requests waiting": 2, "queued": 2,
		"members: grants / fair share": 2, "fair share": 4, "member": 6,
	} {
		if got := count(want); got < n {
			t.Errorf("%q in %d texts, want at least %d", want, got, n)
		}
	}
	if t.Failed() {
		t.Logf("texts: %q", texts)
	}
}

// TestPlotPNG: the PNG is 1344 by 816 pixels (14 by 8.5 inches at 96 dpi) with each
// line's colour drawn.
func TestPlotPNG(t *testing.T) {
	r, err := Run(parse(t, plotOutage), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WritePlot(&buf, "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1344 || b.Dy() != 816 {
		t.Fatalf("size %dx%d, want 1344x816", b.Dx(), b.Dy())
	}
	// One pass over the pixels (each read once: the race detector makes it slow), counting
	// each line's colour and the outage's shade: light orange over white, (255, 238, 222).
	colours := map[string]color.RGBA{"admitted": colAdmitted, "429s": col429, "queue": colQueue, "events": colEvent, "members": colShare}
	counts := map[string]int{}
	shade := 0
	for y := 0; y < 816; y++ {
		for x := 0; x < 1344; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			r, g, b = r>>8, g>>8, b>>8
			for name, want := range colours {
				if absDiff(r, want.R) < 40 && absDiff(g, want.G) < 40 && absDiff(b, want.B) < 40 {
					counts[name]++
				}
			}
			if absDiff(r, 255) <= 4 && absDiff(g, 238) <= 6 && absDiff(b, 222) <= 6 {
				shade++
			}
		}
	}
	for name := range colours {
		if counts[name] < 200 {
			t.Errorf("%s: %d pixels of its colour, want at least 200", name, counts[name])
		}
	}
	if shade < 2*20*200 {
		t.Errorf("%d pixels of the outage's shade, want at least 16,000 (two panels, 10 s of 60 wide, 250 high)", shade)
	}
}

func TestPlotFormat(t *testing.T) {
	for file, want := range map[string]string{"a.svg": "svg", "b.PNG": "png", "c.pdf": "", "d": ""} {
		got, err := PlotFormat(file)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("%s: %q %v, want %q", file, got, err, want)
		}
	}
	r := &Report{}
	if err := r.WritePlot(io.Discard, "svg"); err == nil {
		t.Error("a report without modes plotted")
	}
	r.Modes = []ModeReport{{Mode: "strict"}}
	if err := r.WritePlot(io.Discard, "gif"); err == nil || !strings.Contains(err.Error(), "gif") {
		t.Errorf("gif: %v", err)
	}
	// A report without a series (never run) still draws, without lines.
	if err := r.WritePlot(io.Discard, "png"); err != nil {
		t.Error(err)
	}
}

// TestSideBySide: the text report is one table with a column per mode, in the order
// asked, whose cells are the report's figures, with a row for each event.
func TestSideBySide(t *testing.T) {
	r, err := Run(parse(t, plotOutage), Options{Modes: []string{"local", "strict", "lease"}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	r.WriteText(&buf)
	lines := strings.Split(buf.String(), "\n")
	if head := strings.Fields(lines[2]); !slices.Equal(head, []string{"local", "strict", "lease"}) {
		t.Fatalf("header %q, want the modes in order", lines[2])
	}
	row := func(label string) []string {
		for _, l := range lines {
			// A group's heading (utilization) has no cells.
			if rest, ok := strings.CutPrefix(strings.TrimSpace(l), label+" "); ok {
				return strings.Fields(rest)
			}
		}
		t.Fatalf("no row %q in\n%s", label, buf.String())
		return nil
	}
	for i, m := range r.Modes {
		if got, want := row("violations (429s)")[i], strconv.FormatInt(m.Violations, 10); got != want {
			t.Errorf("%s: violations %s, want %s", m.Mode, got, want)
		}
		if got, want := row("utilization")[i], strconv.FormatFloat(m.Utilization, 'f', 4, 64); got != want {
			t.Errorf("%s: utilization %s, want %s", m.Mode, got, want)
		}
		if got, want := row("store ops")[i], strconv.FormatInt(m.StoreOps, 10); got != want {
			t.Errorf("%s: store ops %s, want %s", m.Mode, got, want)
		}
	}
	if r.Modes[0].StoreOps != 0 || r.Modes[1].StoreOps == 0 {
		t.Errorf("store ops %d (local) and %d (strict): the local mode has no store", r.Modes[0].StoreOps, r.Modes[1].StoreOps)
	}
	// Convergence counts from an event's end: a lasting event's row is labelled with it.
	if c := row(`converged after "store outage for 10s" ended at 30s`); len(c) != 3 {
		t.Errorf("the outage's row: %q", c)
	}
	if ev := r.Modes[1].Events[0]; ev.AtS != 20 || ev.EndS != 30 {
		t.Errorf("the outage at %vs to %vs, want 20 to 30 (events[].end_s, from which convergence_s counts)", ev.AtS, ev.EndS)
	}
	if c := row(`converged after "crash m1" at 40s`); len(c) != 3 {
		t.Errorf("the crash's row: %q", c)
	}
	// The simulator's local mode is one process whose members share its limiter, as
	// sluice demo's: the report says so.
	if m := r.Modes[0].Models; !strings.Contains(m, "one process, as sluice demo --mode local: its 10 members") ||
		!strings.Contains(buf.String(), "\nlocal: "+m+".\n") || r.Modes[1].Models != "" || r.Modes[2].Models != "" {
		t.Errorf("what the modes model: %q, %q, %q; the text report:\n%s", m, r.Modes[1].Models, r.Modes[2].Models, buf.String())
	}
	if c := row("share breaches"); !slices.Equal(c, []string{"-", "-", "0"}) {
		t.Errorf("lease breaches: %q, want - - 0", c)
	}
}

// TestPlotShadesAStoreOutageOnlyWhereThereIsAStore: a store outage's span is shaded in
// the rate panel of a mode with a store (strict), not in that of one without (local),
// though both mark when it happened.
func TestPlotShadesAStoreOutageOnlyWhereThereIsAStore(t *testing.T) {
	r, err := Run(parse(t, plotOutage), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range r.Modes {
		var b bytes.Buffer
		if err := r.WriteModePlot(&b, "svg", i); err != nil {
			t.Fatal(err)
		}
		shaded := strings.Count(b.String(), "fill-opacity:0.13333")
		marked := strings.Count(b.String(), ">store outage for 10s</text>")
		want := 0
		if m.Mode == "strict" {
			want = 1 // the rate panel
		}
		if shaded != want || marked == 0 {
			t.Errorf("%s: the outage shaded %d times (want %d), named %d times", m.Mode, shaded, want, marked)
		}
	}
}

// TestTimeTicksAreWholeUnitsAndEvents: a time axis labels whole units only, and marks each
// event's start and a lasting one's end.
func TestTimeTicksAreWholeUnitsAndEvents(t *testing.T) {
	tt := timeTicks([]EventReport{{AtS: 75, EndS: 105, Event: "store outage for 30s"}, {AtS: 150, EndS: 150}}, unit{"min", 60})
	var marks []float64
	for _, tk := range tt.Ticks(0, 3.5) {
		if tk.Label != "" && tk.Value != math.Trunc(tk.Value) {
			t.Errorf("tick %v labelled %q: want whole minutes only", tk.Value, tk.Label)
		}
		if tk.Label == "" {
			marks = append(marks, tk.Value)
		}
	}
	for _, want := range []float64{1.25, 1.75, 2.5} {
		if !slices.Contains(marks, want) {
			t.Errorf("no mark at %v min (the events'), marks %v", want, marks)
		}
	}
}
