package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// series are the bars of each rival, one per scenario and goroutine count.
var series = []struct {
	scenario   string
	goroutines int
	color      color.RGBA
}{
	{"hot key", 1, color.RGBA{R: 0xf4, G: 0xa5, B: 0x82, A: 0xff}},
	{"hot key", 32, color.RGBA{R: 0xca, G: 0x00, B: 0x20, A: 0xff}},
	{"zipf 10k", 1, color.RGBA{R: 0x92, G: 0xc5, B: 0xde, A: 0xff}},
	{"zipf 10k", 32, color.RGBA{R: 0x05, G: 0x71, B: 0xb0, A: 0xff}},
}

// writePlot draws decisions per second (log scale) and Redis CPU per decision for every
// rival as a PNG.
func writePlot(w io.Writer, rvs []rival, runs []Run) error {
	rs := rows(runs, nil)
	find := func(rival, scenario string, g int) (Row, bool) {
		for _, r := range rs {
			if r.Rival == rival && r.Scenario == scenario && r.Goroutines == g {
				return r, true
			}
		}
		return Row{}, false
	}
	labels := make([]string, len(rvs))
	for i, rv := range rvs {
		// "fleetlimit charge-later, 8 servers" in three lines: the names are wider than a bar group.
		labels[i] = strings.Replace(strings.Replace(rv.Name, ", ", "\n", 1), "fleetlimit ", "fleetlimit\n", 1)
	}

	rate := plot.New()
	rate.Title.Text = "Decisions per second (median of the repeats)"
	rate.Y.Label.Text = "decisions/s (log scale)"
	cpu := plot.New()
	cpu.Title.Text = "Redis CPU per decision (median of the repeats)"
	cpu.Y.Label.Text = "µs of Redis CPU / decision (log scale)"
	panels := []struct {
		p     *plot.Plot
		floor float64 // a log axis has no 0: bars stand on an invisible bar of this height
		value func(Row) float64
	}{
		{rate, 100, func(r Row) float64 { return r.DecPerS }},
		{cpu, 0.0001, func(r Row) float64 { return r.CPUDec }},
	}
	width := vg.Points(14)
	for _, pn := range panels {
		top := pn.floor
		for i, s := range series {
			ground := make(plotter.Values, len(rvs))
			bars := make(plotter.Values, len(rvs))
			for j, rv := range rvs {
				ground[j] = pn.floor
				if r, ok := find(rv.Name, s.scenario, s.goroutines); ok {
					v := pn.value(r)
					if !math.IsNaN(v) && v > pn.floor {
						bars[j] = v - pn.floor
						top = max(top, v)
					}
				}
			}
			g, err := plotter.NewBarChart(ground, width)
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			b, err := plotter.NewBarChart(bars, width)
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			b.StackOn(g)
			b.Offset = vg.Length(i-len(series)/2)*width + width/2
			b.Color = s.color
			b.LineStyle.Width = 0
			pn.p.Add(b)
			pn.p.Legend.Add(s.scenario+", "+goroutines(s.goroutines), b)
		}
		pn.p.Y.Scale = plot.LogScale{}
		pn.p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		pn.p.Y.Min = pn.floor
		pn.p.Y.Max = top * 30 // room for the legend above the bars
		pn.p.NominalX(labels...)
		pn.p.Legend.Top = true
		pn.p.Add(plotter.NewGrid())
	}
	img := vgimg.New(11*vg.Inch, 9*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align([][]*plot.Plot{{rate}, {cpu}}, tiles, dc)
	rate.Draw(canvases[0][0])
	cpu.Draw(canvases[1][0])
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

func nanZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}
