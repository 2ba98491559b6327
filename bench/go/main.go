// Command peers_bench times the Go metrics clients most exporters are
// written with, beside tokenmeter's own benchmarks (docs/performance.md,
// "Peers"; bench/run_all.sh runs it in the same invocation as ours):
//
//	peers_bench observe [flags]
//	    ns per Observe of one histogram child: client_golang classic
//	    buckets, client_golang native (schema 3, the classic buckets kept,
//	    as tokenmeterd's histograms), VictoriaMetrics/metrics' own log
//	    buckets; 1 goroutine and 2 goroutines on one child. The buckets
//	    and the 16 values are those of bench/client_bench.cpp's
//	    prometheus_observe (the 22 TTFT buckets).
//	peers_bench render -text FILE -protobuf FILE [flags]
//	    ms per scrape of a registry of the same shape as
//	    bench/daemon/render_bench.cpp's (its --dump-text and
//	    --dump-protobuf files): client_golang's Gather() and expfmt's text
//	    and delimited protobuf encodings, and VictoriaMetrics/metrics'
//	    WritePrometheus.
//
// The figure is CPU time of the whole process (so a Go scrape pays for its
// garbage collection on other threads) per call, the median over -reps
// repetitions; the cases of one command are interleaved within each
// repetition, so a shared machine's load falls on them alike. Output: a
// line per case, then "RESULT key=value" lines for bench/run_all.sh.
//
// Built from Debian's packages only, offline (bench/go/build.sh):
// golang-go, golang-github-prometheus-client-golang-dev,
// golang-github-victoriametrics-metrics-dev.
package main

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"syscall"
	"time"
	"unsafe"
)

const (
	clockProcessCPUTime = 2 // CLOCK_PROCESS_CPUTIME_ID
)

// cpuNow is the process's CPU time (all threads), in ns.
func cpuNow() int64 {
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME,
		clockProcessCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		fail("clock_gettime: %v", errno)
	}
	return ts.Nano()
}

// timed is one measured case: run(n) makes n calls (split over the case's
// goroutines) and returns what it made.
type timed struct {
	name string // RESULT key part
	run  func(n int) int
	cpu  []float64 // ns per call, one per repetition
	wall []float64
}

// measure runs every case for at least minTime CPU seconds per repetition,
// chunk calls at a time, cases in turn, for reps repetitions.
func measure(cases []*timed, reps int, chunk int, minTime time.Duration) {
	for _, c := range cases { // warm-up
		c.run(chunk)
	}
	for r := 0; r < reps; r++ {
		cpu := make([]int64, len(cases))
		wall := make([]int64, len(cases))
		calls := make([]int, len(cases))
		runtime.GC()
		for {
			done := true
			for i, c := range cases {
				if cpu[i] >= int64(minTime) && calls[i] > 0 {
					continue
				}
				done = false
				w0 := time.Now()
				c0 := cpuNow()
				calls[i] += c.run(chunk)
				cpu[i] += cpuNow() - c0
				wall[i] += int64(time.Since(w0))
			}
			if done {
				break
			}
		}
		for i, c := range cases {
			c.cpu = append(c.cpu, float64(cpu[i])/float64(calls[i]))
			c.wall = append(c.wall, float64(wall[i])/float64(calls[i]))
		}
	}
}

// printCases prints each case's median, min and max CPU time and median
// wall time per call, divided by div (1: ns, 1e6: ms).
func printCases(cases []*timed, unit string, div float64) {
	fmt.Printf("%-32s %9s %9s %9s %9s\n", "case", unit, "min", "max", "wall")
	for _, c := range cases {
		s := append([]float64(nil), c.cpu...)
		sort.Float64s(s)
		fmt.Printf("%-32s %9.3f %9.3f %9.3f %9.3f\n", c.name, median(c.cpu)/div,
			s[0]/div, s[len(s)-1]/div, median(c.wall)/div)
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "peers_bench: "+format+"\n", args...)
	os.Exit(1)
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: peers_bench observe [-reps N] [-min-time D] [-chunk N]\n"+
		"       peers_bench render -text FILE -protobuf FILE [-reps N] [-min-time D]\n")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fmt.Printf("peers_bench: %s, GOMAXPROCS %d, %d CPUs\n", runtime.Version(),
		runtime.GOMAXPROCS(0), runtime.NumCPU())
	switch os.Args[1] {
	case "observe":
		observeMain(os.Args[2:])
	case "render":
		renderMain(os.Args[2:])
	default:
		usage()
	}
}
