package bpf_test

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestMeasureTickWrongFile is issue 25 §3: the tick gate's tick is measured
// (bpf_jiffies64 against CLOCK_MONOTONIC), not read from a config file
// that can be another build's. On this machine the measurement must agree
// with the running kernel's config where there is one; a config that says
// another HZ is reported as disagreeing, and the measured tick is taken.
func TestMeasureTickWrongFile(t *testing.T) {
	testenv.Require(t)
	m, err := bpf.MeasureTick()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured %.3f Hz, tick %d ns; config %s says %d", m.HZ, m.Ns, m.ConfigPath, m.ConfigHZ)
	hz := math.Round(1e9 / float64(m.Ns))
	if math.Abs(hz-m.HZ) > 0.01*hz {
		t.Errorf("tick %d ns (%.0f Hz) at a measured %.3f Hz", m.Ns, hz, m.HZ)
	}
	if m.ConfigHZ != 0 && (!m.ConfigAgrees() || uint64(hz) != m.ConfigHZ) {
		t.Errorf("measured %.3f Hz, the running kernel's %s says CONFIG_HZ=%d", m.HZ, m.ConfigPath, m.ConfigHZ)
	}

	// Fresh measurements, so that a flaky one shows.
	for range 3 {
		rate, err := bpf.MeasureRate()
		if err != nil || math.Abs(rate-hz) > 0.01*hz {
			t.Errorf("measured %.3f Hz again (%v), want %.0f within 1%%", rate, err, hz)
		}
	}

	wrong := uint64(1000)
	if hz == 1000 {
		wrong = 250
	}
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte("# a stale config\nCONFIG_HZ="+strconv.FormatUint(wrong, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := bpf.MeasureTickFrom([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	if got.ConfigHZ != wrong || got.ConfigAgrees() {
		t.Errorf("a config saying CONFIG_HZ=%d: read %d, agrees %v; want it read and found wrong", wrong, got.ConfigHZ, got.ConfigAgrees())
	}
	if got.Ns != m.Ns {
		t.Errorf("with a config saying CONFIG_HZ=%d the tick is %d ns, want the measured %d", wrong, got.Ns, m.Ns)
	}
}
