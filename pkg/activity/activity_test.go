package activity

import (
	"fmt"
	"testing"
	"time"
)

func TestEncodeDecode(t *testing.T) {
	guests := map[string]Guest{
		"web@team-a": {User: "web@team-a", Snapshots: 2, First: time.Unix(100, 0).UTC(), Last: Snapshot{ID: "abc", Path: "/etc", Bytes: 5, Files: 1, Start: time.Unix(200, 0).UTC(), End: time.Unix(201, 0).UTC()}},
		"db@team-b":  {User: "db@team-b", Snapshots: 1},
	}
	back, err := Decode(Encode(guests))
	if err != nil || fmt.Sprint(back) != fmt.Sprint(guests) {
		t.Errorf("round trip: %v, %v", back, err)
	}
	if _, err := Decode([]byte("{not json\n")); err == nil {
		t.Error("a malformed line was accepted")
	}
}
