package adaptive

import (
	"math"
	"time"
)

// The published strategies Sluice is measured against, each as its authors wrote it.
// They pace requests only (a refusal is a refusal, whichever limit made it).

// herokuStrategy is the client of the Heroku client study (Heroku): every goroutine
// sleeps before each request, from its first refusal on.
type herokuStrategy struct {
	sleep      float64 // seconds
	limited    bool    // refused at least once: the goroutines sleep from now on
	multiplyAt int64   // the last doubling
	started    bool
}

// herokuLimit is the limit the Heroku strategy assumes when the answers name none: 4,500
// an hour.
func herokuLimit(c *Controller) (count, window float64) {
	if k := c.q[reqQ]; k.known {
		return k.count, k.count / k.limit
	}
	return 4500, 3600
}

func (s *herokuStrategy) rate(*Controller) float64 {
	if !s.limited || s.sleep <= 0 {
		return 0
	}
	return 1 / s.sleep
}

func (s *herokuStrategy) next(c *Controller, now int64, _ [nQuotas]float64) (int64, Outcome) {
	if !s.limited {
		return now, Send
	}
	return now + nanos(c.jittered(s.sleep)), Send
}

func (*herokuStrategy) cancel(*Controller, int64, [nQuotas]float64) {}

func (s *herokuStrategy) observe(c *Controller, a *answer) {
	count, window := herokuLimit(c)
	minSleep := window / count // one emission interval
	if !s.started {
		s.started = true
		s.sleep = 2 * minSleep
		s.multiplyAt = a.now - int64(window/2*1e9) // "now - 1800" for an hour
	}
	if a.throttled {
		s.limited = true
		if a.newEvent {
			// Double, once per event: the goroutines refused together do not each
			// double ("don't double dip").
			s.sleep *= 2
			s.multiplyAt = a.now
		}
		s.sleep = min(s.sleep, maxPause/1e9)
		return
	}
	r := max(a.remaining[reqQ], 0)
	// The time factor: high just after a doubling (a flappy client comes down slowly),
	// tending to 1 (1.58 after a window).
	since := float64(a.now-s.multiplyAt)/1e9 + 1
	tf := 1 / (1 - math.Exp(-since/window))
	s.sleep -= r * s.sleep / (tf * count)
	s.sleep = max(s.sleep, minSleep/10)
}

// cubicStrategy is the AWS SDKs' adaptive retry rate limiter (Cubic): a token bucket
// whose fill rate follows CUBIC, enabled by the first throttle.
type cubicStrategy struct {
	enabled bool
	// the token bucket
	level, fill, capacity float64
	last                  int64
	// the measured send rate: answers counted per half second, smoothed
	measured, count float64
	lastBucket      float64 // seconds
	// CUBIC
	wMax, k  float64
	lastFail float64 // seconds
	started  bool
}

const (
	cubicC        = 0.4 // scale constant
	cubicBeta     = 0.7 // the cut on a throttle
	cubicMinRate  = 0.5 // the bucket's smallest fill rate, requests a second
	cubicSmooth   = 0.8 // weight of the newest measured rate
	cubicBucketS  = 0.5 // the measured rate is updated every half second
	cubicMaxScale = 2   // the fill rate is at most twice the measured rate
)

func newCubic() *cubicStrategy { return &cubicStrategy{fill: cubicMinRate, capacity: 1} }

func (s *cubicStrategy) rate(*Controller) float64 {
	if !s.enabled {
		return 0
	}
	return s.fill
}

func (s *cubicStrategy) refill(now int64) {
	if now > s.last {
		s.level = min(s.capacity, s.level+float64(now-s.last)/1e9*s.fill)
		s.last = now
	}
}

func (s *cubicStrategy) next(_ *Controller, now int64, _ [nQuotas]float64) (int64, Outcome) {
	if !s.enabled {
		return now, Send
	}
	s.refill(now)
	if s.level >= 1 {
		s.level--
		return now, Send
	}
	// Wait for the token at the fill rate then (botocore's acquire blocks, and looks
	// again when the rate changes).
	return now + max(nanos((1-s.level)/s.fill), 1), Wait
}

func (s *cubicStrategy) cancel(*Controller, int64, [nQuotas]float64) {
	if s.enabled {
		s.level = min(s.level+1, s.capacity) // the token goes back
	}
}

func (s *cubicStrategy) observe(_ *Controller, a *answer) {
	t := float64(a.now) / 1e9
	if !s.started {
		s.started = true
		s.lastFail = t
		s.lastBucket = math.Floor(t)
		s.last = a.now
	}
	// The measured send rate (botocore's RateClocker).
	s.count++
	if b := math.Floor(t/cubicBucketS) * cubicBucketS; b > s.lastBucket {
		s.measured = s.count/(b-s.lastBucket)*cubicSmooth + s.measured*(1-cubicSmooth)
		s.count, s.lastBucket = 0, b
	}
	var rate float64
	if !a.throttled {
		rate = cubicC*math.Pow(t-s.lastFail-s.k, 3) + s.wMax
	} else {
		use := s.measured
		if s.enabled {
			use = min(use, s.fill)
		}
		s.wMax = use
		s.k = math.Cbrt(s.wMax * (1 - cubicBeta) / cubicC)
		s.lastFail = t
		rate = use * cubicBeta
		s.enabled = true
	}
	rate = min(rate, cubicMaxScale*s.measured)
	s.refill(a.now)
	s.fill = max(rate, cubicMinRate)
	s.capacity = max(rate, 1)
	s.level = min(s.level, s.capacity)
}

// sreStrategy is client-side adaptive throttling from Google's SRE book (SRE): no
// pacing; a request is rejected locally with probability
// max(0, (requests − K·accepts) / (requests + 1)) over the last two minutes, K = 2.
type sreStrategy struct {
	req, acc [sreBuckets]float64
	slot     [sreBuckets]int64 // which sreBucket-long interval each bucket counts
}

const (
	sreK       = 2
	sreBuckets = 24
	sreBucket  = 5 * time.Second // 24 of them: two minutes
)

func (s *sreStrategy) rate(*Controller) float64 { return 0 }

// bucket returns the index of the bucket counting now, cleared if it held an older
// interval.
func (s *sreStrategy) bucket(now int64) int {
	idx := now / int64(sreBucket)
	b := int(idx % sreBuckets)
	if b < 0 {
		b += sreBuckets
	}
	if s.slot[b] != idx {
		s.slot[b], s.req[b], s.acc[b] = idx, 0, 0
	}
	return b
}

func (s *sreStrategy) totals(now int64) (req, acc float64) {
	idx := now / int64(sreBucket)
	for b := range s.slot {
		if s.slot[b] > idx-sreBuckets && s.slot[b] <= idx {
			req += s.req[b]
			acc += s.acc[b]
		}
	}
	return req, acc
}

func (s *sreStrategy) next(c *Controller, now int64, _ [nQuotas]float64) (int64, Outcome) {
	req, acc := s.totals(now)
	s.req[s.bucket(now)]++ // every attempt counts, those rejected here too
	if p := (req - sreK*acc) / (req + 1); p > 0 && c.random() < p {
		return now, Reject
	}
	return now, Send
}

func (*sreStrategy) cancel(*Controller, int64, [nQuotas]float64) {}

func (s *sreStrategy) observe(_ *Controller, a *answer) {
	if !a.throttled {
		s.acc[s.bucket(a.now)]++
	}
}
