package sim

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The figure of a report: one row of panels per mode. The first panel is the rate the API
// admitted against the limit over time, with the 429s and the scenario's events marked;
// the second, the requests waiting (in queues and goroutines); the third, each member's
// grants over its fair share.

// PlotFormat names a figure's format from a file name: "svg" or "png".
func PlotFormat(file string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(file)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("want a file ending in .svg or .png, not %q", file)
	}
}

// Figure sizes: a row of panels per mode under a title.
const (
	figWidth   = 14 * vg.Inch
	figRow     = 4 * vg.Inch
	figTitle   = 0.5 * vg.Inch
	figDPI     = 96
	maxPlotted = 2000 // points per line: longer series are averaged down to this
)

var (
	colAdmitted  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colLimit     = color.RGBA{A: 0xff}
	col429       = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colQueue     = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colEvent     = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	colShare     = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colEventSpan = color.NRGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0x22}
)

// WritePlot draws the report's figure, every mode a row of panels, as "svg" or "png".
func (r *Report) WritePlot(w io.Writer, format string) error {
	return r.writeFigure(w, format, r.Modes)
}

// WriteModePlot draws one mode's row of panels alone (the HTML report's figures).
func (r *Report) WriteModePlot(w io.Writer, format string, mode int) error {
	return r.writeFigure(w, format, r.Modes[mode:mode+1])
}

func (r *Report) writeFigure(w io.Writer, format string, modes []ModeReport) error {
	if len(modes) == 0 {
		return fmt.Errorf("sim: no mode to plot")
	}
	width, height := figWidth, figTitle+figRow*vg.Length(len(modes))
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		// With its fonts: a browser that lacks them draws the text in wider ones, over the
		// legend's samples (laid out with these fonts' metrics).
		c = vgsvg.NewWith(vgsvg.UseWH(width, height), vgsvg.EmbedFonts(true))
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(figDPI))}
	default:
		return fmt.Errorf("sim: plot format %q: want svg or png", format)
	}
	dc := draw.New(c)
	title := fmt.Sprintf("%s: %d members, limit %s, %v of virtual time, seed %d", r.Scenario, r.Members, r.Limit,
		time.Duration(r.DurationS*1e9), r.Seed)
	ts := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	ts.Font.Size = 14
	dc.FillText(ts, vg.Point{X: width / 2, Y: height - 0.15*vg.Inch}, title)
	unit := timeUnit(r.DurationS)
	for i := range modes {
		m := &modes[i]
		top := height - figTitle - figRow*vg.Length(i)
		row := vg.Rectangle{Min: vg.Point{X: 0, Y: top - figRow}, Max: vg.Point{X: width, Y: top}}
		// The rate panel takes half the width; the queue and the members a quarter each.
		cuts := []float64{0, 0.52, 0.76, 1}
		panels := []*plot.Plot{r.ratePanel(m, unit), queuePanel(m, unit, r.DurationS), memberPanel(m)}
		for k, p := range panels {
			rect := vg.Rectangle{
				Min: vg.Point{X: row.Min.X + vg.Length(cuts[k])*width + 0.1*vg.Inch, Y: row.Min.Y + 0.1*vg.Inch},
				Max: vg.Point{X: row.Min.X + vg.Length(cuts[k+1])*width - 0.1*vg.Inch, Y: row.Max.Y - 0.1*vg.Inch},
			}
			p.Draw(draw.Canvas{Canvas: dc.Canvas, Rectangle: rect})
		}
	}
	_, err := c.WriteTo(w)
	return err
}

// unit is how the time axis is labelled: seconds, minutes or hours.
type unit struct {
	name string
	s    float64
}

func timeUnit(durationS float64) unit {
	switch {
	case durationS > 3*3600:
		return unit{"h", 3600}
	case durationS > 3*60:
		return unit{"min", 60}
	default:
		return unit{"s", 1}
	}
}

// rates turns the series into points per second, averaged down to at most maxPlotted
// points: admitted, refused (429s), the limit's rate, and the requests queued.
func rates(m *ModeReport, u unit, durationS float64) (admitted, refused, limit, queued plotter.XYs) {
	n := len(m.series)
	for n > 0 && float64(n-1)*m.sample.Seconds() > durationS {
		n--
	}
	step := max(1, (n+maxPlotted-1)/maxPlotted)
	sec := m.sample.Seconds()
	for i := 0; i < n; i += step {
		j := min(n, i+step)
		var acc, rej, capa, q float64
		for _, b := range m.series[i:j] {
			acc += float64(b.accepted)
			rej += float64(b.rejected)
			capa += b.capacity
			q += float64(b.queued)
		}
		k := float64(j - i)
		// Each point at the middle of the samples it averages.
		x := (float64(i) + k/2) * sec / u.s
		span := k * sec
		admitted = append(admitted, plotter.XY{X: x, Y: acc / span})
		refused = append(refused, plotter.XY{X: x, Y: rej / span})
		limit = append(limit, plotter.XY{X: x, Y: capa / span})
		queued = append(queued, plotter.XY{X: x, Y: q / k})
	}
	return
}

func newPanel(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 12
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Y.Tick.Marker = plainTicks{}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

func line(xys plotter.XYs, c color.Color, width vg.Length, dashes ...vg.Length) *plotter.Line {
	l, err := plotter.NewLine(xys)
	if err != nil {
		// NaN or infinite points: the series holds neither.
		panic(err)
	}
	l.Color = c
	l.Width = width
	l.Dashes = dashes
	return l
}

func (r *Report) ratePanel(m *ModeReport, u unit) *plot.Plot {
	title := fmt.Sprintf("%s: %d admitted, %d refused (429), utilization %.3f, Jain %.3f", m.Mode, m.Accepted, m.Violations, m.Utilization, m.Jain)
	p := newPanel(title, "time ("+u.name+")", "requests/s")
	admitted, refused, limit, _ := rates(m, u, r.DurationS)
	if len(admitted) == 0 {
		return p
	}
	la := line(admitted, colAdmitted, 1.2)
	ll := line(limit, colLimit, 1.2, 4, 3)
	lr := line(refused, col429, 1.2)
	p.Add(la, ll, lr)
	p.Legend.Add("admitted", la)
	p.Legend.Add("limit", ll)
	p.Legend.Add("429s", lr)
	if len(m.Events) > 0 {
		ev := &eventMarks{events: m.Events, u: u, store: hasStore(m.Mode)}
		p.Add(ev)
		p.Legend.Add("events", ev)
	}
	p.X.Min, p.X.Max = 0, r.DurationS/u.s
	p.X.Tick.Marker = timeTicks(m.Events, u)
	// The axis holds the limit and all but the highest 1% of the points: an initial burst
	// of many times the rate (a backlog's first second) would flatten the rest.
	top := headroom(limit, quantileXY(0.99, admitted, refused))
	if peak := headroom(admitted, refused) / 1.35; peak > top {
		p.Y.Label.Text = fmt.Sprintf("requests/s (peak %.4g clipped)", peak)
	}
	p.Y.Max = top
	return p
}

// quantileXY is the q-quantile of the series' y values, as one point.
func quantileXY(q float64, series ...plotter.XYs) plotter.XYs {
	var ys []float64
	for _, s := range series {
		for _, pt := range s {
			ys = append(ys, pt.Y)
		}
	}
	if len(ys) == 0 {
		return nil
	}
	slices.Sort(ys)
	return plotter.XYs{{Y: ys[int(q*float64(len(ys)-1))]}}
}

// headroom is the top of a panel's y axis: a third above the highest point, so that the
// legend, in the top right corner, covers no data.
func headroom(series ...plotter.XYs) float64 {
	top := 1.0
	for _, s := range series {
		for _, pt := range s {
			top = max(top, pt.Y)
		}
	}
	return top * 1.35
}

func queuePanel(m *ModeReport, u unit, durationS float64) *plot.Plot {
	p := newPanel("requests waiting", "time ("+u.name+")", "requests")
	_, _, _, queued := rates(m, u, durationS)
	if len(queued) > 0 {
		l := line(queued, colQueue, 1.2)
		p.Add(l)
		p.Legend.Add("queued", l)
		p.Y.Max = headroom(queued)
	}
	p.X.Min, p.X.Max = 0, durationS/u.s
	p.X.Tick.Marker = timeTicks(m.Events, u)
	return p
}

// timeTicker marks a time axis in whole units (seconds, minutes or hours: a default tick
// between two whole ones keeps its mark, not its label) and, unlabelled, at each event.
type timeTicker struct{ at []float64 }

func timeTicks(events []EventReport, u unit) timeTicker {
	var at []float64
	for _, e := range events {
		at = append(at, e.AtS/u.s)
		if e.lasts() {
			at = append(at, e.EndS/u.s)
		}
	}
	return timeTicker{at}
}

func (tt timeTicker) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, t := range (plot.DefaultTicks{}).Ticks(lo, hi) {
		if t.Label != "" && t.Value != math.Trunc(t.Value) {
			t.Label = ""
		}
		ts = append(ts, t)
	}
	for _, a := range tt.at {
		if a >= lo && a <= hi {
			ts = append(ts, plot.Tick{Value: a})
		}
	}
	return ts
}

func memberPanel(m *ModeReport) *plot.Plot {
	p := newPanel("members: grants / fair share", "member", "granted / fair share")
	var pts plotter.XYs
	for i, mr := range m.PerMember {
		if mr.FairShare > 0 {
			pts = append(pts, plotter.XY{X: float64(i + 1), Y: mr.Ratio})
		}
	}
	if len(pts) == 0 {
		return p
	}
	s, err := plotter.NewScatter(pts)
	if err != nil {
		panic(err)
	}
	s.Color = colShare
	s.Shape = draw.CircleGlyph{}
	s.Radius = vg.Points(max(1.5, min(4, 200/float64(len(pts)))))
	fair := line(plotter.XYs{{X: 0.5, Y: 1}, {X: float64(len(m.PerMember)) + 0.5, Y: 1}}, colLimit, 1, 4, 3)
	p.Add(fair, s)
	p.Legend.Add("member", s)
	p.Legend.Add("fair share", fair)
	p.X.Min, p.X.Max = 0.5, float64(len(m.PerMember))+0.5
	p.Y.Max = headroom(pts)
	return p
}

// hasStore reports whether a mode decides with a store: its outages and restarts touch it.
func hasStore(mode string) bool {
	base, _, _ := strings.Cut(mode, ":")
	return base == "strict" || base == "lease"
}

// plainTicks are the default ticks with large values written out whole (2500000, not
// 2500000.00).
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" && math.Abs(ts[i].Value) >= 1e4 {
			ts[i].Label = strconv.FormatFloat(math.Round(ts[i].Value), 'f', 0, 64)
		}
	}
	return ts
}

// eventMarks draws each event as a vertical line across the panel, labelled; a lasting
// one's span shaded, but a store's event on a mode that has no store (nothing happened
// to it then).
type eventMarks struct {
	events []EventReport
	u      unit
	store  bool // the mode has a store
}

func (ev *eventMarks) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	ls := draw.LineStyle{Color: colEvent, Width: 1.2, Dashes: []vg.Length{2, 2}}
	ts := draw.TextStyle{Color: colEvent, Font: plot.DefaultFont, XAlign: draw.XLeft, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	ts.Font.Size = 9
	for i, e := range ev.events {
		x := trX(e.AtS / ev.u.s)
		if e.lasts() && (ev.store || !e.store) {
			// An event that lasts (an outage, a partition, a pause): its span shaded.
			x2 := trX(e.EndS / ev.u.s)
			c.FillPolygon(colEventSpan, c.ClipPolygonX([]vg.Point{{X: x, Y: c.Min.Y}, {X: x2, Y: c.Min.Y}, {X: x2, Y: c.Max.Y}, {X: x, Y: c.Max.Y}}))
		}
		c.StrokeLine2(ls, x, c.Min.Y, x, c.Max.Y)
		// Labels step down so that events close together stay readable.
		y := c.Max.Y - vg.Length(i%4)*11
		c.FillText(ts, vg.Point{X: x + 2, Y: y}, e.Event)
	}
}

func (ev *eventMarks) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(draw.LineStyle{Color: colEvent, Width: 1.2, Dashes: []vg.Length{2, 2}}, c.Min.X, y, c.Max.X, y)
}
