package record

import "time"

// Param is one PARAM-NAME="PARAM-VALUE" of a notice's structured data
// (RFC 5424 §6.3.3), under the episodes' SD-ID shed@32473.
type Param struct{ Name, Value string }

// Notice sends an RFC 5424 message in the episode reports' format
// (severity sev, MSGID msgID, the params, msg) to events.syslog through
// the episodes' one sender, and returns whether one is configured (the
// caller logs the notice either way). The license guard's warnings take
// this path (docs/design.md §13); e nil sends nothing. It never blocks:
// a full queue counts an error in event_reports_total.
func (e *Episodes) Notice(sev int, now time.Time, msgID string, params []Param, msg string) bool {
	if e == nil {
		return false
	}
	p := make([]sdParam, len(params))
	for i, q := range params {
		p[i] = sdParam{q.Name, q.Value}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.send == nil {
		return false
	}
	e.send.send(formatRFC5424(sev, now, e.host, msgID, p, msg))
	return true
}
