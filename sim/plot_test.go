package sim

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// writePlots writes, for every suite, <dir>/<suite>.svg: admitted per second over time for
// each run, against the limit and the demand; and for the outage suite also
// <dir>/redis-outage-breakers.svg: the servers whose breaker is not closed, and the share of
// decisions the failure policy made, over time.
func writePlots(dir string, ss []suite, all [][]outcome) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, s := range ss {
		if err := ratePlot(filepath.Join(dir, s.name+".svg"), s.name, all[i]); err != nil {
			return fmt.Errorf("sim: plot %s: %w", s.name, err)
		}
		if s.name == "redis-outage" {
			if err := breakerPlot(filepath.Join(dir, s.name+"-breakers.svg"), all[i]); err != nil {
				return fmt.Errorf("sim: plot %s breakers: %w", s.name, err)
			}
		}
	}
	return nil
}

// series turns a run's timeline into points at the middle of each bin.
func series(r Result, y func(Bin) float64) plotter.XYs {
	pts := make(plotter.XYs, len(r.Timeline))
	for i, b := range r.Timeline {
		pts[i].X = b.AtS + binWidth.Seconds()/2
		pts[i].Y = y(b)
	}
	return pts
}

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

func ratePlot(path, name string, runs []outcome) error {
	r0 := runs[0].res
	sc, _ := runs[0].sc.withDefaults()
	title := fmt.Sprintf("%s: admitted per second, %d servers, limit %s/s, burst %s", name, sc.Servers, num(sc.Rate), num(float64(sc.Burst)))
	if sc.Keys > 1 {
		title = fmt.Sprintf("%s: admitted per second, all %d keys, %d servers", name, sc.Keys, sc.Servers)
	}
	p := newPlot(title, "requests per second")
	if err := line(p, "demand", series(r0, func(b Bin) float64 { return b.DemandPerS }), grey, vg.Points(1), vg.Points(2), vg.Points(2)); err != nil {
		return err
	}
	if sc.Keys == 1 {
		limit := plotter.XYs{{X: 0, Y: sc.Rate}, {X: sc.Duration.Seconds(), Y: sc.Rate}}
		if err := line(p, "limit", limit, black, vg.Points(1.5), vg.Points(6), vg.Points(3)); err != nil {
			return err
		}
	}
	for i, o := range runs {
		c := plotutil.Color(i)
		if err := line(p, o.name(), series(o.res, func(b Bin) float64 { return b.AdmittedPerS }), c, vg.Points(1.2)); err != nil {
			return err
		}
	}
	if w := sc.Outage; w.End > w.Start {
		for _, x := range []float64{w.Start.Seconds(), w.End.Seconds()} {
			if err := vline(p, x); err != nil {
				return err
			}
		}
	}
	p.Y.Min, p.X.Min, p.X.Max = 0, 0, sc.Duration.Seconds()
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

func breakerPlot(path string, runs []outcome) error {
	sc, _ := runs[0].sc.withDefaults()
	top := newPlot(fmt.Sprintf("Redis down %v-%v: servers whose breaker is open or half-open", sc.Outage.Start, sc.Outage.End), "servers")
	bottom := newPlot("share of decisions made by the failure policy", "share")
	var hybrids []outcome
	for _, o := range runs {
		if o.st == Hybrid {
			hybrids = append(hybrids, o)
		}
	}
	// The breakers do not depend on the policy: when every run has the same curves,
	// draw them once.
	same := true
	for _, o := range hybrids[1:] {
		for i, b := range o.res.Timeline {
			h := hybrids[0].res.Timeline[i]
			same = same && b.BreakersOpen == h.BreakersOpen && b.FallbackShare == h.FallbackShare
		}
	}
	if same {
		hybrids[0].label = "every policy (identical)"
		hybrids = hybrids[:1]
	}
	for i, o := range hybrids {
		c := plotutil.Color(i)
		if err := line(top, o.name(), series(o.res, func(b Bin) float64 { return float64(b.BreakersOpen) }), c, vg.Points(1.2)); err != nil {
			return err
		}
		if err := line(bottom, o.name(), series(o.res, func(b Bin) float64 { return b.FallbackShare }), c, vg.Points(1.2)); err != nil {
			return err
		}
	}
	top.Y.Min, bottom.Y.Min, bottom.Y.Max = 0, 0, 1
	top.X.Min, top.X.Max = 0, sc.Duration.Seconds()
	bottom.X.Min, bottom.X.Max = 0, sc.Duration.Seconds()
	plots := [][]*plot.Plot{{top}, {bottom}}
	w, h := 24*vg.Centimeter, 18*vg.Centimeter
	img := vgimg(w, h, path)
	dc := draw.New(img.canvas)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter}
	canvases := plot.Align(plots, tiles, dc)
	for j := range plots {
		plots[j][0].Draw(canvases[j][0])
	}
	return img.save()
}

// svgFile is an SVG canvas that writes itself to a file.
type svgFile struct {
	canvas *vgsvg.Canvas
	path   string
}

func vgimg(w, h vg.Length, path string) *svgFile {
	return &svgFile{canvas: vgsvg.New(w, h), path: path}
}

func (s *svgFile) save() error {
	f, err := os.Create(s.path)
	if err != nil {
		return err
	}
	if _, err := s.canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
