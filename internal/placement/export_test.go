package placement

// For the benchmarks of package placement_test, which run the policies of
// internal/policies (they import this package, so benchmarks
// using them cannot live in it).
var (
	BigCluster    = bigCluster
	BenchRequests = benchRequests
)
