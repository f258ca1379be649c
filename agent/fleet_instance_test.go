package agent

import "testing"

// TestFleetInstanceFile: the instance file sits beside the state file, one
// per pin path as the state file is, and none without a state file.
func TestFleetInstanceFile(t *testing.T) {
	for state, want := range map[string]string{
		"/var/lib/tierlimit/episode.json":                       "/var/lib/tierlimit/fleet-instance",
		"/var/lib/tierlimit/episode@%2Fsys%2Ffs%2Fbpf%2Fx.json": "/var/lib/tierlimit/fleet-instance@%2Fsys%2Ffs%2Fbpf%2Fx",
		"/tmp/my-state.json":                                    "/tmp/my-state.json.fleet-instance",
		"":                                                      "",
	} {
		if got := FleetInstanceFile(state); got != want {
			t.Errorf("FleetInstanceFile(%q) = %q; want %q", state, got, want)
		}
	}
}
