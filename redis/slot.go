package redis

// hashSlot returns the Redis Cluster hash slot of a key name: CRC16 (XMODEM) of its hash
// tag, the part between the first '{' and the next '}' if that part is not empty, or else
// of the whole name, modulo 16384.
func hashSlot(name string) int {
	for i := 0; i < len(name); i++ {
		if name[i] == '{' {
			for j := i + 1; j < len(name); j++ {
				if name[j] == '}' {
					if j > i+1 {
						name = name[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	var crc uint16
	for i := 0; i < len(name); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^name[i]]
	}
	return int(crc & 16383)
}

// crc16Table is the table of CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the
// CRC of Redis Cluster's key slots.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
