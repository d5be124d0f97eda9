package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// bar is one variant's figure in a panel; hi marks remutex.
type bar struct {
	label string
	v     float64
	hi    bool
}

// panel is one comparison of the chart.
type panel struct {
	title string
	unit  string
	log   bool
	bars  []bar
	ref   float64 // a reference line (floor, limit), 0 for none
	refLb string
}

// chart draws the main comparisons as horizontal bar panels, remutex in its
// own colour.
func chart(r *results) string {
	panels := chartPanels(r)
	height := chartTop
	for _, pn := range panels {
		height += pn.height()
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="24" font-size="16" font-weight="bold">remutex and other Go Redis locks: %s</text>`+"\n",
		html.EscapeString(r.Started.UTC().Format("2006-01-02")+", "+r.Machine.CPU+", "+fmt.Sprint(r.Machine.Cores)+" cores, redis "+r.Machine.Redis))
	y := chartTop
	for _, pn := range panels {
		pn.draw(&b, y)
		y += pn.height()
	}
	p("</svg>\n")
	return b.String()
}

// The chart's layout, in pixels.
const (
	chartWidth = 900
	chartTop   = 50  // the title above the first panel
	barLeft    = 150 // labels to the left, bars to the right
	barW       = 600 // the longest bar
	rowH       = 20
	titleH     = 28
	panelGap   = 18
)

// chartPanels returns the panels of the chart, one per comparison that has
// any bars.
func chartPanels(r *results) []panel {
	var panels []panel
	add := func(title, unit string, log bool, ref float64, refLb string, f func(name string) (float64, bool)) {
		pn := panel{title: title, unit: unit, log: log, ref: ref, refLb: refLb}
		for _, v := range r.Variants {
			if x, ok := f(v.Name); ok && x > 0 && !math.IsInf(x, 0) {
				pn.bars = append(pn.bars, bar{v.Name, x, v.Remutex})
			}
		}
		if len(pn.bars) > 0 {
			panels = append(panels, pn)
		}
	}
	panels = append(panels, instrPanels(r)...)
	cyc := r.cycleMetric
	cont := r.contendedMetric
	add("Uncontended Lock+Unlock cycle (lower is better)", "µs", false, 2*us(r.Floor.RTT), "2 PINGs",
		cyc(func(c *cycleResult) float64 { return us(c.Cycle) }))
	add("Allocations per cycle (lower is better)", "allocs", false, 0, "",
		cyc(func(c *cycleResult) float64 { return c.Allocs }))
	add("Uncontended: Redis CPU per cycle (machine-dependent, lower is better)", "µs", false, 0, "",
		cyc(func(c *cycleResult) float64 { return us(c.CPU) }))
	add("Contended: lock utilisation, time held / wall time (higher is better)", "%", false, 0, "",
		cont(func(c *contendedResult) float64 { return 100 * c.Utilisation }))
	add("Contended: mean hand-off gap in round trips (lower is better, log scale)", "RTT", true, 0, "",
		cont(func(c *contendedResult) float64 { return float64(c.GapMean) / float64(r.Floor.RTT) }))
	add("Contended: wait p99 (lower is better, log scale)", "ms", true, 20, "20 ms",
		cont(func(c *contendedResult) float64 { return ms(c.WaitP99) }))
	add("Contended: Redis CPU per acquisition (machine-dependent, lower is better)", "µs", false, 0, "",
		cont(func(c *contendedResult) float64 { return us(c.CPU) }))
	at := func(locks int, sel func(*scaleResult) float64) metric { return r.scaleMetric(locks, sel) }
	perSec := func(c *scaleResult) float64 { return c.PerSecond }
	cpuPer := func(c *scaleResult) float64 { return us(c.CPU) }
	add(fmt.Sprintf("Scale, %d locks in use: cycles/s (higher is better)", scaleTarget), "/s", false, 0, "", at(scaleTarget, perSec))
	add(fmt.Sprintf("Scale, %d locks in use: Redis CPU per cycle (machine-dependent, lower is better)", scaleTarget), "µs", false, 0, "", at(scaleTarget, cpuPer))
	add("Scale, 1024 locks in use: Redis CPU per cycle (machine-dependent, lower is better)", "µs", false, 0, "", at(1024, cpuPer))
	add("Many held locks: renewal round trips per lease/3 (lower is better, log scale)", "", true, 0, "",
		func(n string) (float64, bool) {
			h, ok := r.Held[n]
			if !ok {
				return 0, false
			}
			return h.perPeriod(), true
		})
	return append(panels, rwPanels(r)...)
}

func (pn panel) height() int { return titleH + rowH*len(pn.bars) + panelGap }

// draw writes the panel with its top at y.
func (pn panel) draw(b *strings.Builder, y int) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p(`<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+16, html.EscapeString(pn.title))
	y += titleH
	scale := pn.scale()
	for i, br := range pn.bars {
		yy := y + i*rowH
		fill := "#9aa5b1"
		if br.hi {
			fill = "#d9480f"
		}
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", barLeft-8, yy+14, html.EscapeString(br.label))
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", barLeft, yy+3, max(scale(br.v), 1), rowH-6, fill)
		p(`<text x="%.1f" y="%d">%s %s</text>`+"\n", float64(barLeft)+max(scale(br.v), 1)+4, yy+14, num(br.v), pn.unit)
	}
	if pn.ref > 0 {
		x := float64(barLeft) + scale(pn.ref)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1c7ed6" stroke-dasharray="4 3"/>`+"\n", x, y, x, y+rowH*len(pn.bars))
		p(`<text x="%.1f" y="%d" fill="#1c7ed6" font-size="10">%s</text>`+"\n", x+3, y-2, html.EscapeString(pn.refLb))
	}
}

// scale returns the length of a bar of value v: linear from 0 to the largest
// value, or logarithmic from half the smallest.
func (pn panel) scale() func(v float64) float64 {
	hi := pn.ref
	lo := math.Inf(1)
	for _, br := range pn.bars {
		hi = max(hi, br.v)
		lo = min(lo, br.v)
	}
	if pn.ref > 0 {
		lo = min(lo, pn.ref)
	}
	lo /= 2
	return func(v float64) float64 {
		if pn.log {
			if v <= lo {
				return 0
			}
			return barW * math.Log(v/lo) / math.Log(hi/lo)
		}
		return barW * v / hi
	}
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
