package render

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Page is what HTML shows beside the report's own figures.
type Page struct {
	// Title heads the page; empty, it is "fleetlimit fleet simulation".
	Title string
	// Text is, per scenario name, preformatted text shown under the scenario's table: the
	// simulator's own table and notes, as `go test -v ./sim` logs them.
	Text map[string]string
}

// HTML reads the report at path, writes every scenario's plots into dir as SVG does, and
// writes <dir>/index.html: per scenario, a table of its runs (admissions against the
// limit and the hottest key's bound, Redis calls and round trips per request, Redis busy
// share, decision latency) followed by p's text for it and its plots, inlined so that
// the page can be opened or mailed alone. It returns the files written, the page last.
func HTML(path, dir string, p Page) ([]string, error) {
	scs, err := readFile(path)
	if err != nil {
		return nil, err
	}
	files, err := render(dir, scs)
	if err != nil {
		return files, err
	}
	if p.Title == "" {
		p.Title = "fleetlimit fleet simulation"
	}
	data := pageData{Title: p.Title}
	for _, s := range scs {
		sd := sectionData{Name: s.name, Text: strings.TrimRight(p.Text[s.name], "\n"), Runs: s.runs}
		r0 := s.runs[0]
		keys := num(float64(r0.Keys)) + " keys"
		if r0.Keys == 1 {
			keys = "one key"
		}
		sd.About = fmt.Sprintf("%d servers, %s, limit %s/s and burst %s per key, demand %s/s, %s of virtual time",
			r0.Servers, keys, num(r0.LimitPerS), num(float64(r0.Burst)), num(math.Round(r0.DemandPerS)), seconds(r0.DurationS))
		for _, name := range []string{s.name + ".svg", s.name + "-breakers.svg"} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if os.IsNotExist(err) {
				continue
			}
			if err != nil {
				return files, err
			}
			sd.Plots = append(sd.Plots, template.HTML(inlineSVG(b))) // drawn here, not user input
		}
		data.Sections = append(data.Sections, sd)
	}
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, data); err != nil {
		return files, err
	}
	index := filepath.Join(dir, "index.html")
	if err := os.WriteFile(index, b.Bytes(), 0o644); err != nil {
		return files, err
	}
	return append(files, index), nil
}

// inlineSVG strips an SVG document's XML declaration and doctype, so that it can stand
// inside an HTML page.
func inlineSVG(b []byte) []byte {
	if i := bytes.Index(b, []byte("<svg")); i > 0 {
		return b[i:]
	}
	return b
}

type pageData struct {
	Title    string
	Sections []sectionData
}

type sectionData struct {
	Name, About, Text string
	Runs              []run
	Plots             []template.HTML
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"num": func(x float64) string { return num(math.Round(x)) },
	"f":   func(prec int, x float64) string { return fmt.Sprintf("%.*f", prec, x) },
	"pct": func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) },
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { text-align: left; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
nav li { display: inline; margin-right: 1em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<nav><ul>{{range .Sections}}<li><a href="#{{.Name}}">{{.Name}}</a></li>{{end}}</ul></nav>
<p>adm/limit is admissions over the limit (over Σ min(requests, bound) across keys);
hottest key/bound is the hottest key's admissions over burst + rate·T; busy is the share of
Redis's time spent serving; latencies are per decision.</p>
{{range .Sections}}
<section id="{{.Name}}">
<h2>{{.Name}}</h2>
<p>{{.About}}</p>
<table>
<thead><tr><th>strategy</th><th>admitted/s</th><th>adm/limit</th><th>hottest key/bound</th><th>Redis calls/req</th><th>round trips/req</th><th>Redis busy</th><th>p50 µs</th><th>p99 µs</th><th>max µs</th></tr></thead>
<tbody>
{{range .Runs}}<tr><td>{{.Strategy}}</td><td class="n">{{num .AdmittedPerS}}</td><td class="n">{{f 4 .AdmittedOverLimit}}</td><td class="n">{{f 4 .HottestKeyOverBound}}</td><td class="n">{{f 4 .RedisCallsPerRequest}}</td><td class="n">{{f 4 .RedisRoundTripsPerRequest}}</td><td class="n">{{pct .RedisBusy}}</td><td class="n">{{f 0 .P50DecisionUS}}</td><td class="n">{{f 0 .P99DecisionUS}}</td><td class="n">{{f 0 .MaxDecisionUS}}</td></tr>
{{end}}</tbody>
</table>
{{with .Text}}<pre>{{.}}</pre>{{end}}
{{range .Plots}}<figure>{{.}}</figure>
{{end}}</section>
{{end}}
</body>
</html>
`))
