package redistest

import (
	"flag"
	"runtime"
	"strconv"
)

// DefaultParallel sets go test's -test.parallel to n (or GOMAXPROCS, if
// that is more) unless the command line set it. A TestMain calls it before
// m.Run, for a package whose parallel tests spend their time waiting (on
// leases, failovers, cut links and servers of their own), not computing:
// go test's default, GOMAXPROCS, would run two of them at once on two
// cores, one after the other what could wait at once.
func DefaultParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}
