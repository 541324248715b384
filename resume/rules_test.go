package resume

import (
	"encoding/json"
	"math"
	"testing"
)

func TestHole(t *testing.T) {
	tests := []struct {
		name       string
		seq, first uint64
		want       bool
	}{
		{"next event retained", 4, 5, false},
		{"cursor past the first retained", 9, 5, false},
		{"one event evicted", 3, 5, true},
		{"priming cursor, first retained is 1", 0, 1, false},
		{"priming cursor, first retained is 2", 0, 2, true},
		{"nothing retained, cursor at the end", 10, 11, false},
		{"first 0 (no record) is never a hole", 3, 0, false},
		{"max seq cannot overflow into a hole", math.MaxUint64, math.MaxUint64, false},
	}
	for _, tt := range tests {
		if got := Hole(tt.seq, tt.first); got != tt.want {
			t.Errorf("%s: Hole(%d, %d) = %v, want %v", tt.name, tt.seq, tt.first, got, tt.want)
		}
	}
}

func TestPlanEndOfReplay(t *testing.T) {
	live := Plan{Replay: true, From: 3, UpTo: 10, Then: Live}
	sealed := Plan{Replay: true, From: 3, UpTo: 10, ResetAfter: ReasonGenerationChanged, Then: End}
	if !live.Delivers(11) || !live.Delivers(1000) {
		t.Error("a live plan delivers every event, also past UpTo")
	}
	if !sealed.Delivers(10) || sealed.Delivers(11) {
		t.Error("a replay delivers up to UpTo and not past it (events appended after the decision)")
	}
	open := Stream{LastSeq: 12}
	done := Stream{LastSeq: 12, Terminal: true}
	if live.ReplayDone(10, done) || live.ReplayDone(1000, done) {
		t.Error("a live plan never ends its replay")
	}
	if sealed.ReplayDone(9, open) || !sealed.ReplayDone(10, open) || !sealed.ReplayDone(11, open) {
		t.Error("a replay is done at UpTo")
	}
	waiting := Plan{Replay: true, From: 3, UpTo: UntilSeal, ResetAfter: ReasonGenerationChanged, Then: End}
	if !waiting.Delivers(1<<40) || waiting.ReplayDone(12, open) || waiting.ReplayDone(11, done) || !waiting.ReplayDone(12, done) {
		t.Error("a replay UntilSeal delivers everything and is done at the stream's terminal event only")
	}
	if got := sealed.ResetAfterDue(""); got != ReasonGenerationChanged {
		t.Errorf("after an ordinary event the reset is due, got %q", got)
	}
	if got := sealed.ResetAfterDue(EventReset); got != "" {
		t.Errorf("a replay that ended with the seal's own reset gets no second one, got %q", got)
	}
	if AtTerminal(true) != CurrentStandalone || AtTerminal(false) != End {
		t.Error("a sealed standalone stream goes on with the current one; a request stream ends")
	}
	if p := Tail(StreamKey{1}, 4, 7); p.Then != Live || !p.Replay || p.From != 7 || p.Generation != 4 || p.ResetBefore != "" {
		t.Errorf("Tail = %+v", p)
	}
}

func TestResetJSON(t *testing.T) {
	r := Reset{Reason: ReasonBackendLost, Stream: "k", Generation: 3, Lost: []json.RawMessage{json.RawMessage(`7`), json.RawMessage(`"a"`)}}
	got := string(r.Marshal())
	want := `{"reason":"backend_lost","stream":"k","generation":3,"lost":[7,"a"]}`
	if got != want {
		t.Errorf("Marshal = %s, want %s", got, want)
	}
	if got := string(Reset{Reason: ReasonGap, Stream: "k", Generation: 1}.Marshal()); got != `{"reason":"gap","stream":"k","generation":1}` {
		t.Errorf("a reset without lost requests omits lost: %s", got)
	}
}
