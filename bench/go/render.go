package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// family is one parsed family of tokenmeterd's exposition with the label
// names its samples share (in their order in the exposition).
type family struct {
	mf     *dto.MetricFamily
	labels []string
}

func readText(path string) map[string]*dto.MetricFamily {
	f, err := os.Open(path)
	if err != nil {
		fail("%v", err)
	}
	defer f.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(f)
	if err != nil {
		fail("%s: %v", path, err)
	}
	return fams
}

// nativeBuckets counts the populated native buckets (and zero buckets) in
// a delimited protobuf exposition.
func nativeBuckets(r io.Reader) (populated int, histograms int) {
	dec := expfmt.NewDecoder(r, expfmt.FmtProtoDelim)
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err == io.EOF {
			break
		} else if err != nil {
			fail("protobuf exposition: %v", err)
		}
		for _, m := range mf.Metric {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			histograms++
			for _, d := range [][]int64{h.PositiveDelta, h.NegativeDelta} {
				var c int64
				for _, x := range d {
					if c += x; c != 0 {
						populated++
					}
				}
			}
			if h.GetZeroCount() != 0 {
				populated++
			}
		}
	}
	return populated, histograms
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, lp := range m.Label {
		out = append(out, lp.GetName())
	}
	return out
}

func labelValues(m *dto.Metric) []string {
	var out []string
	for _, lp := range m.Label {
		out = append(out, lp.GetValue())
	}
	return out
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// spread returns observations that land in the buckets with the given
// per-bucket counts (bucket i is (bounds[i-1], bounds[i]]; the last one,
// past bounds, is the +Inf bucket) with a sum as close to `sum` as such a
// spread allows: the c values of a bucket (a, b] are
// a*(b/a)^(((k+0.5)/c)^g), k = 0..c-1, log-spread over the bucket for
// g = 1, crowded towards a for a larger g and towards b for a smaller one;
// the same g for every bucket, found by bisection (the sum falls as g
// grows). The first bucket starts at half its bound (the render fixture's
// values start there), the +Inf bucket ends at 1.5 times the last bound
// (the fixture's end). Returns the values and their sum, added in order as
// an Observe loop adds them.
func spread(bounds []float64, counts []uint64, sum float64) ([]float64, float64) {
	gen := func(g float64, out []float64) ([]float64, float64) {
		out = out[:0]
		s := 0.0
		for i, c := range counts {
			if c == 0 {
				continue
			}
			var a, b float64
			switch {
			case i == 0 && bounds[0] <= 0:
				a, b = bounds[0], bounds[0] // only the bound itself fits
			case i == 0:
				a, b = bounds[0]/2, bounds[0]
			case i == len(bounds):
				a, b = bounds[i-1], 1.5*bounds[i-1]
			default:
				a, b = bounds[i-1], bounds[i]
			}
			if a <= 0 && b > 0 { // (0, b]
				a = b / 2
			}
			for k := uint64(0); k < c; k++ {
				v := b
				if a < b {
					x := math.Pow((float64(k)+0.5)/float64(c), g)
					v = math.Min(a*math.Pow(b/a, x), b)
					if i > 0 {
						v = math.Max(v, math.Nextafter(a, math.Inf(1)))
					}
				}
				out = append(out, v)
				s += v
			}
		}
		return out, s
	}
	lo, hi := -30.0, 30.0 // log g: the sum falls from lo to hi
	var buf []float64
	if _, s := gen(math.Exp(lo), buf); s <= sum {
		return gen(math.Exp(lo), nil)
	}
	if _, s := gen(math.Exp(hi), buf); s >= sum {
		return gen(math.Exp(hi), nil)
	}
	for it := 0; it < 60; it++ {
		mid := (lo + hi) / 2
		if _, s := gen(math.Exp(mid), buf); s > sum {
			lo = mid
		} else {
			hi = mid
		}
	}
	return gen(math.Exp(hi), nil)
}

// histogramObservations turns a parsed classic histogram into its bounds
// and the observations that rebuild it.
func histogramObservations(h *dto.Histogram) ([]float64, []float64, float64) {
	var bounds []float64
	var counts []uint64
	prev := uint64(0)
	for _, b := range h.Bucket {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue
		}
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, b.GetCumulativeCount()-prev)
		prev = b.GetCumulativeCount()
	}
	counts = append(counts, h.GetSampleCount()-prev)
	values, sum := spread(bounds, counts, h.GetSampleSum())
	return bounds, values, sum
}

// vmName is VictoriaMetrics/metrics' name for a sample: name{k="v",...}.
func vmName(name string, m *dto.Metric) string {
	if len(m.Label) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, lp := range m.Label {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(lp.GetName())
		b.WriteString(`="`)
		v := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(lp.GetValue())
		b.WriteString(v)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// peers holds the two registries built from tokenmeterd's exposition.
type peers struct {
	reg       *prometheus.Registry
	set       *vm.Set
	maxSumRel float64 // largest relative _sum difference of a histogram
}

func buildPeers(fams map[string]*dto.MetricFamily) *peers {
	p := &peers{reg: prometheus.NewRegistry(), set: vm.NewSet()}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		mf := fams[name]
		if len(mf.Metric) == 0 {
			continue
		}
		lnames := labelNames(mf.Metric[0])
		for _, m := range mf.Metric {
			if !sameStrings(labelNames(m), lnames) {
				fail("family %s: samples with different label names (%v, %v)",
					name, lnames, labelNames(m))
			}
		}
		help := mf.GetHelp()
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, lnames)
			p.reg.MustRegister(vec)
			for _, m := range mf.Metric {
				v := m.GetCounter().GetValue()
				vec.WithLabelValues(labelValues(m)...).Add(v)
				if v >= 0 && v == math.Trunc(v) && v < 1<<63 {
					p.set.NewCounter(vmName(name, m)).Set(uint64(v))
				} else {
					p.set.NewFloatCounter(vmName(name, m)).Add(v)
				}
			}
		case dto.MetricType_GAUGE:
			vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, lnames)
			p.reg.MustRegister(vec)
			for _, m := range mf.Metric {
				v := m.GetGauge().GetValue()
				vec.WithLabelValues(labelValues(m)...).Set(v)
				p.set.NewGauge(vmName(name, m), func() float64 { return v })
			}
		case dto.MetricType_HISTOGRAM:
			bounds, _, _ := histogramObservations(mf.Metric[0].GetHistogram())
			vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name: name, Help: help, Buckets: bounds,
				NativeHistogramBucketFactor:    nativeFactor,
				NativeHistogramMaxBucketNumber: nativeMaxBuckets,
			}, lnames)
			p.reg.MustRegister(vec)
			for _, m := range mf.Metric {
				b, values, sum := histogramObservations(m.GetHistogram())
				if len(b) != len(bounds) {
					fail("family %s: children with different bucket layouts", name)
				}
				child := vec.WithLabelValues(labelValues(m)...)
				vh := p.set.NewHistogram(vmName(name, m))
				for _, v := range values {
					child.Observe(v)
					vh.Update(v)
				}
				want := m.GetHistogram().GetSampleSum()
				if d := math.Abs(sum-want) / math.Max(math.Abs(want), 1e-300); d > p.maxSumRel && want != 0 {
					p.maxSumRel = d
				}
			}
		default:
			fail("family %s: unexpected type %v", name, mf.GetType())
		}
	}
	return p
}

// flatten maps name{sorted labels} to the value of every sample a text
// exposition holds (buckets, sums and counts as their own samples).
func flatten(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	key := func(name string, m *dto.Metric, extra ...string) string {
		ls := append([]string(nil), extra...)
		for _, lp := range m.Label {
			ls = append(ls, lp.GetName()+"="+lp.GetValue())
		}
		sort.Strings(ls)
		return name + "{" + strings.Join(ls, ",") + "}"
	}
	for name, mf := range fams {
		for _, m := range mf.Metric {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key(name, m)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key(name, m)] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.Bucket {
					le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
					out[key(name+"_bucket", m, "le="+le)] = float64(b.GetCumulativeCount())
				}
				out[key(name+"_bucket", m, "le=+Inf")] = float64(h.GetSampleCount())
				out[key(name+"_sum", m)] = h.GetSampleSum()
				out[key(name+"_count", m)] = float64(h.GetSampleCount())
			}
		}
	}
	return out
}

func countSamples(text []byte) int {
	n := 0
	for _, line := range bytes.Split(text, []byte("\n")) {
		if len(line) > 0 && line[0] != '#' {
			n++
		}
	}
	return n
}

func renderMain(args []string) {
	fs := flag.NewFlagSet("render", flag.ExitOnError)
	textPath := fs.String("text", "", "tokenmeterd's text exposition (render_bench --dump-text)")
	pbPath := fs.String("protobuf", "", "tokenmeterd's protobuf exposition (render_bench --dump-protobuf)")
	reps := fs.Int("reps", 10, "repetitions (the median is reported)")
	minTime := fs.Duration("min-time", 200e6, "CPU time per case per repetition")
	fs.Parse(args)
	if *textPath == "" || *pbPath == "" {
		usage()
	}

	ours := readText(*textPath)
	p := buildPeers(ours)

	// What client_golang renders must hold tokenmeterd's samples: every
	// one equal but the histograms' _sum, whose observations are made up
	// inside each bucket (within maxSumRel of the original).
	var text, proto, vmText bytes.Buffer
	mfs, err := p.reg.Gather()
	if err != nil {
		fail("gather: %v", err)
	}
	enc := expfmt.NewEncoder(&text, expfmt.FmtText)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			fail("encode: %v", err)
		}
	}
	var tp expfmt.TextParser
	theirs, err := tp.TextToMetricFamilies(bytes.NewReader(text.Bytes()))
	if err != nil {
		fail("client_golang's own text does not parse: %v", err)
	}
	a, b := flatten(ours), flatten(theirs)
	mismatches := 0
	for k, v := range a {
		w, ok := b[k]
		tol := 1e-15
		if strings.Contains(k, "_sum{") {
			tol = math.Max(p.maxSumRel, 1e-15) * 1.01
		}
		if !ok || (w != v && math.Abs(w-v) > tol*math.Max(math.Abs(v), 1)) {
			if mismatches++; mismatches <= 5 {
				fmt.Fprintf(os.Stderr, "peers_bench: sample differs: %s %v vs %v\n", k, v, w)
			}
		}
	}
	if len(a) != len(b) || mismatches > 0 {
		fail("client_golang's exposition differs from tokenmeterd's (%d vs %d samples, %d mismatches)",
			len(a), len(b), mismatches)
	}
	if p.maxSumRel > 1e-6 {
		fail("histogram sums could not be matched (relative difference %g)", p.maxSumRel)
	}
	enc = expfmt.NewEncoder(&proto, expfmt.FmtProtoDelim)
	for _, mf := range mfs {
		enc.Encode(mf)
	}
	p.set.WritePrometheus(&vmText)
	ourPb, err := os.ReadFile(*pbPath)
	if err != nil {
		fail("%v", err)
	}
	tmNative, tmHists := nativeBuckets(bytes.NewReader(ourPb))
	cgNative, cgHists := nativeBuckets(bytes.NewReader(proto.Bytes()))
	ourText, _ := os.ReadFile(*textPath)
	fmt.Printf("render: tokenmeterd %d samples (%d bytes text, %d bytes protobuf); "+
		"client_golang %d samples (%d bytes text, %d bytes protobuf), every sample equal "+
		"(histogram _sum within %.1e); VictoriaMetrics %d samples (%d bytes, its own buckets)\n",
		countSamples(ourText), len(ourText), len(ourPb), countSamples(text.Bytes()),
		text.Len(), proto.Len(), p.maxSumRel, countSamples(vmText.Bytes()), vmText.Len())
	fmt.Printf("render: native buckets populated: tokenmeterd %d in %d histograms, "+
		"client_golang %d in %d\n", tmNative, tmHists, cgNative, cgHists)

	var buf bytes.Buffer
	scrape := func(format expfmt.Format) func(n int) int {
		return func(n int) int {
			for i := 0; i < n; i++ {
				mfs, err := p.reg.Gather()
				if err != nil {
					fail("gather: %v", err)
				}
				buf.Reset()
				enc := expfmt.NewEncoder(&buf, format)
				for _, mf := range mfs {
					enc.Encode(mf)
				}
			}
			return n
		}
	}
	cases := []*timed{
		{name: "client_golang_text", run: scrape(expfmt.FmtText)},
		{name: "client_golang_protobuf", run: scrape(expfmt.FmtProtoDelim)},
		{name: "victoriametrics_text", run: func(n int) int {
			for i := 0; i < n; i++ {
				buf.Reset()
				p.set.WritePrometheus(&buf)
			}
			return n
		}},
	}
	measure(cases, *reps, 1, *minTime)
	printCases(cases, "ms", 1e6)
	fmt.Printf("RESULT render_client_golang_samples=%d\n", countSamples(text.Bytes()))
	fmt.Printf("RESULT render_victoriametrics_samples=%d\n", countSamples(vmText.Bytes()))
	fmt.Printf("RESULT render_tokenmeterd_native_buckets=%d\n", tmNative)
	fmt.Printf("RESULT render_client_golang_native_buckets=%d\n", cgNative)
	for _, c := range cases {
		fmt.Printf("RESULT render_%s_ms=%.4f\n", c.name, median(c.cpu)/1e6)
	}
}
