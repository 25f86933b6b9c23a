package notify

import "testing"

func TestSignalCoalesces(t *testing.T) {
	s := New()
	select {
	case <-s.C():
		t.Fatal("pending before any event")
	default:
	}
	h := s.Handler()
	h.OnAdd(nil, false)
	h.OnUpdate(nil, nil)
	h.OnDelete(nil)
	<-s.C()
	select {
	case <-s.C():
		t.Fatal("three events woke the loop twice")
	default:
	}
}
