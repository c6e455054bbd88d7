package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// palette gives each policy line a distinct colour.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteSVG plots mean unallocated GPU % against arrived workload, one line
// per policy, as a self-contained SVG, with the floors at 100% (if fl is
// not nil) as two ticks.
func WriteSVG(w io.Writer, rs []PolicyResult, fl *FloorResult, title string) error {
	const (
		width, height          = 720, 440
		left, right, top, bott = 60, 170, 40, 50
		xMin, xMax             = 80.0, 130.0
	)
	yMax := 0.0
	for _, r := range rs {
		for x := int(xMin); x < len(r.Curve); x++ {
			yMax = math.Max(yMax, r.Curve[x])
		}
	}
	yMax = math.Max(5, math.Ceil(yMax/5)*5)
	pw, ph := float64(width-left-right), float64(height-top-bott)
	px := func(x float64) float64 { return float64(left) + (x-xMin)/(xMax-xMin)*pw }
	py := func(y float64) float64 { return float64(top) + (1-y/yMax)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, html.EscapeString(title))
	for x := xMin; x <= xMax; x += 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px(x), top, px(x), height-bott)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n", px(x), height-bott+16, x)
	}
	for y := 0.0; y <= yMax; y += 5 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(y), width-right, py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, py(y)+4, y)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">arrived workload (%% of GPU capacity)</text>`+"\n", px((xMin+xMax)/2), height-12)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">unallocated GPU (%%)</text>`+"\n", float64(top)+ph/2)
	for i, r := range rs {
		col := palette[i%len(palette)]
		var pts []string
		for x := int(xMin); x < len(r.Curve) && float64(x) <= xMax; x++ {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(x)), py(r.Curve[x])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		ly := top + 14 + 18*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", width-right+12, ly-4, width-right+32, ly-4, col)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+38, ly, html.EscapeString(r.Policy))
	}
	if fl != nil {
		ly := top + 14 + 18*len(rs)
		for i, f := range []struct {
			y     float64
			dash  string
			label string
		}{{fl.AnyPolicy.Mean, "", "floor, any policy"}, {fl.NeverRefuse.Mean, ` stroke-dasharray="6 2"`, "floor, never refuse"}, {fl.AllShares.Mean, ` stroke-dasharray="3 2"`, "floor, all shares"}} {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="2"%s/>`+"\n", px(97), py(f.y), px(103), py(f.y), f.dash)
			y := ly + 18*i
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black" stroke-width="2"%s/>`+"\n", width-right+12, y-4, width-right+32, y-4, f.dash)
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+38, y, f.label)
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
