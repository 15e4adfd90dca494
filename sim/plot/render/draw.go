package render

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// render writes, for every scenario, <dir>/<name>.svg (admitted per second over time for
// each run, against the limit and the demand) and, for a scenario with an outage and
// hybrid runs, <dir>/<name>-breakers.svg (the servers whose breaker is not closed, and the
// share of decisions the failure policy made, over time). It returns the files written.
func render(dir string, scs []scenario) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, s := range scs {
		path := filepath.Join(dir, s.name+".svg")
		if err := ratePlot(path, s.name, s.runs); err != nil {
			return files, fmt.Errorf("plot %s: %w", s.name, err)
		}
		files = append(files, path)
		if hybrids := hybridRuns(s.runs); s.runs[0].Outage != nil && len(hybrids) > 0 {
			path := filepath.Join(dir, s.name+"-breakers.svg")
			if err := breakerPlot(path, s.runs[0], hybrids); err != nil {
				return files, fmt.Errorf("plot %s breakers: %w", s.name, err)
			}
			files = append(files, path)
		}
	}
	return files, nil
}

// hybridRuns returns the runs of the hybrid strategy: the only ones with a failure policy.
func hybridRuns(runs []run) []run {
	var out []run
	for _, r := range runs {
		if r.Policy != "" {
			out = append(out, r)
		}
	}
	return out
}

// series turns a run's timeline into points at the middle of each bin.
func series(r run, y func(bin) float64) plotter.XYs {
	pts := make(plotter.XYs, len(r.Timeline))
	for i, b := range r.Timeline {
		pts[i].X = b.AtS + r.BinS/2
		pts[i].Y = y(b)
	}
	return pts
}

// line adds a named line to p and its legend.
func line(p *plot.Plot, name string, pts plotter.XYs, c color.Color, width vg.Length, dashes ...vg.Length) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.LineStyle.Color, l.LineStyle.Width, l.LineStyle.Dashes = c, width, dashes
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// newPlot is a plot over virtual time with a grid and the legend at the top right.
func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "virtual time (s)"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	return p
}

var (
	grey  = color.Gray{Y: 110}
	black = color.Black
)

// ratePlot draws admitted requests per second of every run, the demand and (for one key)
// the limit, with the outage's start and end marked.
func ratePlot(path, name string, runs []run) error {
	r0 := runs[0]
	title := fmt.Sprintf("%s: admitted per second, %d servers, limit %s/s, burst %s", name, r0.Servers, num(r0.LimitPerS), num(float64(r0.Burst)))
	if r0.Keys > 1 {
		title = fmt.Sprintf("%s: admitted per second, all %d keys, %d servers", name, r0.Keys, r0.Servers)
	}
	p := newPlot(title, "requests per second")
	if err := line(p, "demand", series(r0, func(b bin) float64 { return b.DemandPerS }), grey, vg.Points(1), vg.Points(2), vg.Points(2)); err != nil {
		return err
	}
	if r0.Keys == 1 {
		limit := plotter.XYs{{X: 0, Y: r0.LimitPerS}, {X: r0.DurationS, Y: r0.LimitPerS}}
		if err := line(p, "limit", limit, black, vg.Points(1.5), vg.Points(6), vg.Points(3)); err != nil {
			return err
		}
	}
	for i, r := range runs {
		if err := line(p, r.Strategy, series(r, func(b bin) float64 { return b.AdmittedPerS }), plotutil.Color(i), vg.Points(1.2)); err != nil {
			return err
		}
	}
	if w := r0.Outage; w != nil {
		for _, x := range []float64{w.StartS, w.EndS} {
			if err := vline(p, x); err != nil {
				return err
			}
		}
	}
	p.Y.Min, p.X.Min, p.X.Max = 0, 0, r0.DurationS
	return p.Save(24*vg.Centimeter, 12*vg.Centimeter, path)
}

// vline marks an instant (the outage's start and end).
func vline(p *plot.Plot, x float64) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
	if err != nil {
		return err
	}
	l.LineStyle.Color, l.LineStyle.Dashes = color.RGBA{R: 200, A: 255}, []vg.Length{vg.Points(1), vg.Points(3)}
	p.Add(l)
	return nil
}

// breakerPlot draws, for the hybrid runs of a scenario with an outage, the servers whose
// breaker is open or half-open (top) and the share of decisions made by the failure
// policy (bottom).
func breakerPlot(path string, r0 run, hybrids []run) error {
	top := newPlot(fmt.Sprintf("Redis down %v-%v: servers whose breaker is open or half-open", seconds(r0.Outage.StartS), seconds(r0.Outage.EndS)), "servers")
	bottom := newPlot("share of decisions made by the failure policy", "share")
	// The breakers do not depend on the policy: when every run has the same curves,
	// draw them once.
	same := true
	for _, r := range hybrids[1:] {
		for i, b := range r.Timeline {
			h := hybrids[0].Timeline[i]
			same = same && b.BreakersOpen == h.BreakersOpen && b.FallbackShare == h.FallbackShare
		}
	}
	if same {
		hybrids = []run{hybrids[0]}
		hybrids[0].Strategy = "every policy (identical)"
	}
	for i, r := range hybrids {
		c := plotutil.Color(i)
		if err := line(top, r.Strategy, series(r, func(b bin) float64 { return float64(b.BreakersOpen) }), c, vg.Points(1.2)); err != nil {
			return err
		}
		if err := line(bottom, r.Strategy, series(r, func(b bin) float64 { return b.FallbackShare }), c, vg.Points(1.2)); err != nil {
			return err
		}
	}
	top.Y.Min, bottom.Y.Min, bottom.Y.Max = 0, 0, 1
	top.X.Min, top.X.Max = 0, r0.DurationS
	bottom.X.Min, bottom.X.Max = 0, r0.DurationS
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvas := vgsvg.New(24*vg.Centimeter, 18*vg.Centimeter)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter}
	canvases := plot.Align(plots, tiles, draw.New(canvas))
	for j := range plots {
		plots[j][0].Draw(canvases[j][0])
	}
	return save(canvas, path)
}

// save writes an SVG canvas to a file.
func save(canvas *vgsvg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// seconds turns a report's seconds back into the duration the scenario set, for titles.
func seconds(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}

// num prints a count compactly, with thousands separators: 150000 -> 150,000; a
// fraction with three digits.
func num(x float64) string {
	if x != math.Trunc(x) {
		return fmt.Sprintf("%.3g", x)
	}
	return english.Sprintf("%d", int64(x))
}

var english = message.NewPrinter(language.English)
