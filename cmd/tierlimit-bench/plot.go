package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotSweep draws offered against passed packets per window: the model
// (tiers.Expected) as a line, each method's measured windows as points, and
// writes it to path (the format from its extension: .png or .svg).
func plotSweep(path string, cfg *floodConfig, pts []sweepPoint) error {
	tab, err := tierTable(cfg)
	if err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Offered vs passed per %v window (max %d, tiers %s)", cfg.window, cfg.max, tierString(cfg.policy()))
	p.X.Label.Text = "offered: selected packets in the window"
	p.Y.Label.Text = "passed: messages the collector processed"
	p.Add(plotter.NewGrid())

	var hi float64
	for _, pt := range pts {
		hi = max(hi, float64(pt.Offered))
	}
	hi = max(hi*1.05, 3*float64(cfg.max))
	model := make(plotter.XYs, 0, 601)
	for i := 0; i <= 600; i++ {
		x := hi * float64(i) / 600
		model = append(model, plotter.XY{X: x, Y: tab.Expected(uint64(x)).Passed})
	}
	line, err := plotter.NewLine(model)
	if err != nil {
		return err
	}
	line.Color = color.Black
	line.Width = vg.Points(1.5)
	p.Add(line)
	p.Legend.Add("model (tiers.Expected)", line)

	styles := map[method]struct {
		c     color.Color
		shape draw.GlyphDrawer
	}{
		methodXDP: {color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, draw.CircleGlyph{}},
		methodApp: {color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, draw.SquareGlyph{}},
		methodNFT: {color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, draw.TriangleGlyph{}},
	}
	for _, m := range []method{methodXDP, methodApp, methodNFT} {
		var xys plotter.XYs
		for _, pt := range pts {
			if pt.Method == m {
				xys = append(xys, plotter.XY{X: float64(pt.Offered), Y: float64(pt.Passed)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		st := styles[m]
		sc.GlyphStyle.Color, sc.GlyphStyle.Shape, sc.GlyphStyle.Radius = st.c, st.shape, vg.Points(3.5)
		p.Add(sc)
		p.Legend.Add(string(m)+" (measured)", sc)
	}
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), vg.Points(8)
	p.X.Min, p.Y.Min = 0, 0
	p.X.Max = hi
	p.Y.Max = max(tab.Expected(uint64(hi)).Passed, maxPassed(pts)) * 1.15
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

func maxPassed(pts []sweepPoint) float64 {
	var m float64
	for _, p := range pts {
		m = max(m, float64(p.Passed))
	}
	return m
}
