package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestHealthChecks(t *testing.T) {
	local := service("local", "10.43.0.20", corev1.ServiceTypeLoadBalancer, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local.Spec.HealthCheckNodePort = 32000
	elsewhere := local.DeepCopy()
	elsewhere.Name, elsewhere.Spec.HealthCheckNodePort = "elsewhere", 31000
	cluster := service("cluster", "10.43.0.21", corev1.ServiceTypeLoadBalancer, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30081, Protocol: corev1.ProtocolTCP})
	eps := []*discoveryv1.EndpointSlice{
		slice("local", "http", 8080,
			onNode("10.42.0.5", "node-a", true, true, false),
			onNode("10.42.0.6", "node-a", false, true, true), // terminating: not counted
			onNode("10.42.1.5", "node-b", true, true, false)),
		slice("elsewhere", "http", 8080, onNode("10.42.1.6", "node-b", true, true, false)),
		slice("cluster", "http", 8080, onNode("10.42.0.7", "node-a", true, true, false)),
	}
	got := HealthChecks([]*corev1.Service{local, elsewhere, cluster}, eps, "node-a")
	want := []HealthCheck{
		{Port: 31000, Namespace: "default", Name: "elsewhere", LocalEndpoints: 0},
		{Port: 32000, Namespace: "default", Name: "local", LocalEndpoints: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("HealthChecks = %+v, want %+v", got, want)
	}

	h := newHealthServer()
	h.checks[32000], h.checks[31000] = want[1], want[0]
	for _, tc := range []struct {
		port   uint16
		status int
		count  int
	}{{32000, http.StatusOK, 1}, {31000, http.StatusServiceUnavailable, 0}} {
		rec := httptest.NewRecorder()
		h.handler(tc.port).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		var body struct {
			Service        map[string]string
			LocalEndpoints int
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tc.status || body.LocalEndpoints != tc.count || body.Service["namespace"] != "default" {
			t.Errorf("port %d answered %d %s, want %d with %d local endpoints", tc.port, rec.Code, rec.Body, tc.status, tc.count)
		}
	}
}

// A dual-stack pod is an endpoint in a slice of each family: it counts
// once.
func TestHealthChecksDualStack(t *testing.T) {
	svc := dualStack(service("local", "fd43::20", corev1.ServiceTypeLoadBalancer, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}), "10.43.0.20")
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 32000
	eps := []*discoveryv1.EndpointSlice{
		slice("local", "http", 8080, onNode("10.42.0.5", "node-a", true, true, false)),
		slice6("local", "http", 8080, onNode("fd42::5", "node-a", true, true, false), onNode("fd42::6", "node-a", true, true, false)),
	}
	got := HealthChecks([]*corev1.Service{svc}, eps, "node-a")
	if want := []HealthCheck{{Port: 32000, Namespace: "default", Name: "local", LocalEndpoints: 2}}; !reflect.DeepEqual(got, want) {
		t.Errorf("HealthChecks = %+v, want %+v (the endpoints of the primary family, IPv6)", got, want)
	}
}
