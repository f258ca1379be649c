package agent

import (
	"github.com/tierlimit/tierlimit/agent/pin"
)

// Status is the pinned state, read with no agent running: the links and
// the layout record (pin.Pinned), and one Snapshot of the maps.
type Status struct {
	pin.Pinned
	Snapshot
}

// ReadStatus reads the links and maps pinned under path, of this layout or
// an older one. Returns ErrNotPinned when nothing is pinned there and
// *NewerLayoutError for a newer layout.
func ReadStatus(path string) (Status, error) {
	p, lim, err := pin.Read(path)
	st := Status{Pinned: p}
	if err != nil {
		return st, err
	}
	defer lim.Close()
	st.Snapshot, err = TakeSnapshot(lim)
	return st, err
}
