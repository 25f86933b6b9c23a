package proxy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// HealthCheck is the healthCheckNodePort of a Service with
// externalTrafficPolicy Local: a load balancer asks it whether this node
// has endpoints of the Service, and sends traffic only to nodes that do.
type HealthCheck struct {
	Port            uint16
	Namespace, Name string
	LocalEndpoints  int // ready endpoints on this node
}

// HealthChecks returns the health check ports node serves, in port order.
func HealthChecks(svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, node string) []HealthCheck {
	bySvc := slicesByService(eps)
	var out []HealthCheck
	for _, svc := range svcs {
		if svc.Spec.HealthCheckNodePort == 0 || !externalLocal(svc) {
			continue
		}
		// A dual-stack pod is in a slice of each family: its endpoints are
		// counted in those of the Service's primary family.
		primary := primaryAddressType(svc)
		local := map[string]bool{}
		for _, s := range bySvc[svc.Namespace+"/"+svc.Name] {
			if s.AddressType != primary {
				continue
			}
			for _, e := range s.Endpoints {
				if ptr.Deref(e.NodeName, "") == node && ptr.Deref(e.Conditions.Ready, true) && len(e.Addresses) > 0 {
					local[e.Addresses[0]] = true
				}
			}
		}
		out = append(out, HealthCheck{Port: uint16(svc.Spec.HealthCheckNodePort), Namespace: svc.Namespace, Name: svc.Name, LocalEndpoints: len(local)})
	}
	slices.SortFunc(out, func(a, b HealthCheck) int { return cmp.Compare(a.Port, b.Port) })
	return out
}

// primaryAddressType is the type of the endpoint slices of a Service's
// first IP family.
func primaryAddressType(svc *corev1.Service) discoveryv1.AddressType {
	if len(svc.Spec.IPFamilies) > 0 {
		return discoveryv1.AddressType(svc.Spec.IPFamilies[0])
	}
	if ips := clusterIPs(svc); len(ips) > 0 {
		return addressType(ips[0])
	}
	return discoveryv1.AddressTypeIPv4
}

// healthServer answers on the health check ports the way kube-proxy does:
// 200 with the count of local endpoints, 503 where there are none.
type healthServer struct {
	mu      sync.Mutex
	checks  map[uint16]HealthCheck
	servers map[uint16]*http.Server
}

func newHealthServer() *healthServer {
	return &healthServer{checks: map[uint16]HealthCheck{}, servers: map[uint16]*http.Server{}}
}

// update serves checks from now on: it opens the ports that are new and
// closes those no longer wanted. A port it cannot open is reported and
// tried again at the next update.
func (h *healthServer) update(checks []HealthCheck) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.checks)
	for _, c := range checks {
		h.checks[c.Port] = c
	}
	var errs []error
	for port, srv := range h.servers {
		if _, ok := h.checks[port]; !ok {
			_ = srv.Close()
			delete(h.servers, port)
		}
	}
	for port := range h.checks {
		if _, ok := h.servers[port]; ok {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			errs = append(errs, fmt.Errorf("health check port %d: %w", port, err))
			continue
		}
		srv := &http.Server{Handler: h.handler(port)}
		h.servers[port] = srv
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.WithError(err).WithField("port", port).Warn("health check port stopped serving")
			}
		}()
	}
	return errors.Join(errs...)
}

func (h *healthServer) handler(port uint16) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		c := h.checks[port]
		h.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", fmt.Sprint(c.LocalEndpoints))
		if c.LocalEndpoints == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"service":             map[string]string{"namespace": c.Namespace, "name": c.Name},
			"localEndpoints":      c.LocalEndpoints,
			"serviceProxyHealthy": true,
		})
	})
}

// close stops serving every port.
func (h *healthServer) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, srv := range h.servers {
		_ = srv.Close()
		delete(h.servers, port)
	}
}
