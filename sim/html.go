package sim

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"time"
)

// WriteHTML writes the report as one self-contained page: the figures side by side (a
// column per mode), then per mode its figure, each event's convergence and each member's
// part. The figures are SVG inlined as data URIs; the page fetches nothing and runs no
// script.
func (r *Report) WriteHTML(w io.Writer) error {
	type section struct {
		ModeReport
		Figure template.URL
	}
	data := struct {
		*Report
		Duration string
		Rows     []Row
		Sections []section
	}{Report: r, Duration: time.Duration(r.DurationS * 1e9).String(), Rows: r.SideBySide()}
	for i := range r.Modes {
		var svg bytes.Buffer
		if err := r.WriteModePlot(&svg, "svg", i); err != nil {
			return err
		}
		uri := "data:image/svg+xml;base64," + base64.StdEncoding.EncodeToString(svg.Bytes())
		data.Sections = append(data.Sections, section{ModeReport: r.Modes[i], Figure: template.URL(uri)})
	}
	return htmlReport.Execute(w, data)
}

// maxMembersShown bounds each mode's table of members in the HTML report.
const maxMembersShown = 1000

var htmlReport = template.Must(template.New("report").Funcs(template.FuncMap{
	"conv": func(s float64) string {
		if s < 0 {
			return "did not converge before the end"
		}
		return fmt.Sprintf("%gs after it ended", s)
	},
	"at":    func(s float64) string { return time.Duration(s * 1e9).String() },
	"first": func(ms []MemberReport) []MemberReport { return ms[:min(len(ms), maxMembersShown)] },
	"more":  func(ms []MemberReport) int { return max(0, len(ms)-maxMembersShown) },
	"newGroup": func(rows []Row, i int) bool {
		return i == 0 || rows[i-1].Group != rows[i].Group
	},
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>sluice sim: {{.Scenario}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
th.group { text-align: left; background: #f3f3f3; }
td.label { padding-left: 1.6em; }
img.figure { width: 100%; max-width: 1400px; height: auto; }
section { margin-top: 2.5em; }
</style>
</head>
<body>
<h1>sluice sim: {{.Scenario}}</h1>
<p>{{.Members}} members, limit {{.Limit}}, {{.Duration}} of virtual time, seed {{.Seed}}.</p>
<h2>The modes side by side</h2>
<table id="side-by-side">
<thead><tr><th></th>{{range .Modes}}<th class="n">{{.Mode}}</th>{{end}}</tr></thead>
<tbody>
{{- $rows := .Rows}}
{{- range $i, $r := .Rows}}
{{- if newGroup $rows $i}}
<tr><th class="group">{{$r.Group}}</th>{{range $.Modes}}<th class="group"></th>{{end}}</tr>
{{- end}}
<tr><td class="label">{{$r.Label}}</td>{{range $r.Cells}}<td class="n">{{.}}</td>{{end}}</tr>
{{- end}}
</tbody>
</table>
{{range .Sections}}
<section class="mode" id="mode-{{.Mode}}">
<h2>{{.Mode}}</h2>
{{- if .Models}}
<p class="models">{{.Mode}}: {{.Models}}.</p>
{{- end}}
<p><img class="figure" alt="{{.Mode}}: the admitted rate against the limit, the queue and each member's share" src="{{.Figure}}"></p>
{{- if .Events}}
<h3>Events</h3>
<table class="events">
<thead><tr><th>at</th><th>event</th><th>ended</th><th>converged</th></tr></thead>
<tbody>
{{- range .Events}}
<tr><td class="n">{{at .AtS}}</td><td>{{.Event}}</td><td class="n">{{at .EndS}}</td><td>{{conv .ConvergenceS}}</td></tr>
{{- end}}
</tbody>
</table>
{{- end}}
<details>
<summary>Each member ({{len .PerMember}})</summary>
<table class="members">
<thead><tr><th>member</th><th class="n">granted</th><th class="n">rejected</th><th class="n">dropped</th><th class="n">fair share</th><th class="n">ratio</th></tr></thead>
<tbody>
{{- range first .PerMember}}
<tr><td>{{.Name}}</td><td class="n">{{.Granted}}</td><td class="n">{{.Rejected}}</td><td class="n">{{.Dropped}}</td><td class="n">{{printf "%.1f" .FairShare}}</td><td class="n">{{printf "%.4f" .Ratio}}</td></tr>
{{- end}}
</tbody>
</table>
{{- with more .PerMember}}<p>and {{.}} more (the JSON report has them all).</p>{{end}}
</details>
</section>
{{end}}
</body>
</html>
`))
