package token

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

func TestBootstrap(t *testing.T) {
	ctx := t.Context()
	c := fake.NewClientset()
	forever, err := CreateBootstrap(ctx, c, 0, "edge nodes")
	if err != nil {
		t.Fatal(err)
	}
	day, err := CreateBootstrap(ctx, c, 24*time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{forever, day} {
		if !IsBootstrap(s) {
			t.Fatalf("%q is not a bootstrap token", s)
		}
	}
	list, err := ListBootstrap(ctx, c)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %+v %v", list, err)
	}
	now := time.Now()
	for _, tc := range []struct {
		name   string
		secret string
		at     time.Time
		want   bool
	}{
		{"forever", forever, now.Add(1000 * time.Hour), true},
		{"a day, now", day, now, true},
		{"a day, later", day, now.Add(25 * time.Hour), false},
		{"wrong secret", forever[:7] + "0123456789abcdef", now, false},
		{"unknown id", "zzzzzz.0123456789abcdef", now, false},
		{"not a bootstrap token", "s3cret", now, false},
	} {
		if got, err := VerifyBootstrap(ctx, c, tc.secret, tc.at); err != nil || got != tc.want {
			t.Errorf("%s: %v %v, want %v", tc.name, got, err, tc.want)
		}
	}
	if err := DeleteBootstrap(ctx, c, forever[:6]); err != nil {
		t.Fatal(err)
	}
	if ok, _ := VerifyBootstrap(ctx, c, forever, now); ok {
		t.Error("a deleted token still joins")
	}
	if err := DeleteBootstrap(ctx, c, forever[:6]); err == nil {
		t.Error("deleting it twice: no error")
	}
}
