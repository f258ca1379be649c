package main

// The shed record's figures (issue 23, docs/design.md §10): the bpf package's
// BenchmarkRecord (test_run), BenchmarkLiveFramesRecord (live frames) and
// BenchmarkRecordTransport (ring buffer against perf event array; in the
// bpf test binary when built with the tag tlperf, as make bench builds it).

const (
	recordTestRun   = "BenchmarkRecord/selected-drop"
	recordOver      = "BenchmarkRecord/sources-over"
	recordLive      = "BenchmarkLiveFramesRecord"
	recordTransport = "BenchmarkRecordTransport"
)

// recordTargets are issue 23's rows of the targets table.
func (r *report) recordTargets(p func(string, ...any)) {
	tr := statOf(values(r.bench, recordTestRun, "x-off"))
	p("| test_run, drop path with the shed record on at 100/s ≤ 1.1× off (issue 23) | %s× (over budget %s×; share below 1 %s×) | %s |",
		tr.f(2), statOf(values(r.bench, recordOver, "x-off")).f(2), statOf(values(r.bench, recordTestRun, "share-x-off")).f(2), yes(tr.n > 0 && tr.med <= 1.1))
	lv := statOf(values(r.bench, recordLive, "x-off"))
	p("| live frames, drop path with the shed record on ≥ 0.9× off Mpps (issue 23) | %s× (share below 1 %s×) | %s |",
		lv.f(2), statOf(values(r.bench, recordLive, "share-x-off")).f(2), yes(lv.n > 0 && lv.med >= 0.9))
}

// recordFigure is figure 2's part for the shed record.
func (r *report) recordFigure(p func(string, ...any)) {
	if len(values(r.bench, recordLive, "Mpps")) == 0 {
		return
	}
	p("**With the shed record** (docs/design.md §10, issue 23): the drop path sampling shed packets at the default cap (100/s), beside the same path with sampling off, chunk by chunk in the same run; *share* is sampling on with the eligible share the agent sets under a flood (every shed packet that finds a token draws). Test run (`BenchmarkRecord`, ns/pkt) and live frames (`BenchmarkLiveFramesRecord`, Mpps, the samples read from the ring as the agent reads them):")
	p("")
	p("| | sampling on | share below 1 | sampling off | on / off | share / off |")
	p("|---|---|---|---|---|---|")
	for _, n := range []string{recordTestRun, recordOver} {
		p("| test_run %s, ns/pkt | %s | %s | %s | %s× | %s× |", n[len("BenchmarkRecord/"):], statOf(values(r.bench, n, "on-ns/pkt")).f(1),
			statOf(values(r.bench, n, "share-ns/pkt")).f(1), statOf(values(r.bench, n, "off-ns/pkt")).f(1),
			statOf(values(r.bench, n, "x-off")).f(2), statOf(values(r.bench, n, "share-x-off")).f(2))
	}
	p("| live frames, Mpps | %s | %s | %s | %s× | %s× |", statOf(values(r.bench, recordLive, "Mpps")).f(2),
		statOf(values(r.bench, recordLive, "share-Mpps")).f(2), statOf(values(r.bench, recordLive, "off-Mpps")).f(2),
		statOf(values(r.bench, recordLive, "x-off")).f(2), statOf(values(r.bench, recordLive, "share-x-off")).f(2))
	p("")
	if len(values(r.bench, recordTransport, "ring-ns/sample")) == 0 {
		return
	}
	p("**Ring buffer or perf event array** (`BenchmarkRecordTransport`: the program built both ways, every packet sampled, each transport's reader reading and decoding the samples, same run): what one sample costs the program above the same drop path unsampled, and the agent's reader.")
	p("")
	p("| transport | program ns/sample | × ring | reader ns/sample | × ring |")
	p("|---|---|---|---|---|")
	p("| ring buffer (the program's) | %s | 1× | %s | 1× |", statOf(values(r.bench, recordTransport, "ring-ns/sample")).f(0), statOf(values(r.bench, recordTransport, "ring-read-ns/sample")).f(0))
	for _, t := range []struct{ name, what string }{{"perf", "perf event array, reader woken at every sample"}, {"perf-batch", "perf event array, reader woken every 64 samples"}} {
		p("| %s | %s | %s× | %s | %s× |", t.what, statOf(values(r.bench, recordTransport, t.name+"-ns/sample")).f(0),
			statOf(values(r.bench, recordTransport, t.name+"-x-ring")).f(2), statOf(values(r.bench, recordTransport, t.name+"-read-ns/sample")).f(0),
			statOf(values(r.bench, recordTransport, t.name+"-read-x-ring")).f(2))
	}
	p("")
}
