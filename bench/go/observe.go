package main

import (
	"flag"
	"fmt"
	"sync"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// The 22 TTFT buckets (seconds) and the 16 values observed in turn, as
// bench/client_bench.cpp's prometheus_observe has them.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
	0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

var ttftSamples = [16]float64{0.003, 0.012, 0.03, 0.05, 0.07, 0.09, 0.2,
	0.4, 0.6, 0.9, 1.7, 3.0, 6.0, 8.5, 15.0, 0.15}

// tokenmeterd's native histograms: schema 3 (a bucket factor of
// 2^(1/8) = 1.0905, which client_golang picks for any factor in
// [1.0905, 1.1892)), zero threshold 2^-128 (client_golang's default),
// at most 160 populated buckets (daemon/store/native_histogram.h).
const (
	nativeFactor     = 1.1
	nativeMaxBuckets = 160
)

// observer is what one call site holds: a child resolved once.
type observer interface{ Observe(float64) }

type vmObserver struct{ h *vm.Histogram }

func (o vmObserver) Observe(v float64) { o.h.Update(v) }

// onGoroutines makes n calls of o.Observe split over g goroutines that all
// observe the same child, as engine threads sharing one histogram would.
func onGoroutines(o observer, g int) func(n int) int {
	return func(n int) int {
		per := n / g
		var wg sync.WaitGroup
		wg.Add(g)
		for k := 0; k < g; k++ {
			go func() {
				defer wg.Done()
				for i := 0; i < per; i++ {
					o.Observe(ttftSamples[i&15])
				}
			}()
		}
		wg.Wait()
		return per * g
	}
}

func newClientGolangChild(native bool) observer {
	opts := prometheus.HistogramOpts{
		Name:    "bench_time_to_first_token_seconds",
		Help:    "Benchmark anchor: TTFT histogram",
		Buckets: ttftBuckets,
	}
	if native {
		opts.NativeHistogramBucketFactor = nativeFactor
		opts.NativeHistogramMaxBucketNumber = nativeMaxBuckets
	}
	reg := prometheus.NewRegistry()
	vec := prometheus.NewHistogramVec(opts, []string{"model_name", "engine"})
	reg.MustRegister(vec)
	return vec.WithLabelValues("bench-model", "0")
}

func observeMain(args []string) {
	fs := flag.NewFlagSet("observe", flag.ExitOnError)
	reps := fs.Int("reps", 10, "repetitions (the median is reported)")
	minTime := fs.Duration("min-time", 200e6, "CPU time per case per repetition")
	chunk := fs.Int("chunk", 100000, "calls per timed chunk")
	fs.Parse(args)

	set := vm.NewSet()
	vmChild := vmObserver{set.NewHistogram(
		`bench_time_to_first_token_seconds{model_name="bench-model",engine="0"}`)}
	children := []struct {
		name string
		o    observer
	}{
		{"client_golang_classic", newClientGolangChild(false)},
		{"client_golang_native", newClientGolangChild(true)},
		{"victoriametrics", vmChild},
	}
	var cases []*timed
	for _, g := range []int{1, 2} {
		for _, c := range children {
			cases = append(cases, &timed{
				name: fmt.Sprintf("%s_g%d", c.name, g),
				run:  onGoroutines(c.o, g),
			})
		}
	}
	measure(cases, *reps, *chunk, *minTime)
	printCases(cases, "ns/call", 1)
	for _, c := range cases {
		fmt.Printf("RESULT observe_%s_ns=%.2f\n", c.name, median(c.cpu))
	}
}
