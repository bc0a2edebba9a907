//! [`DType`]: the element types of tensors, as safetensors names them.

use std::fmt;
use std::str::FromStr;

use crate::error::FormatError;

macro_rules! dtypes {
    ($( $(#[$doc:meta])* $v:ident = $code:literal, $name:literal, $size:literal, $float:literal; )*) => {
        /// A tensor element type. The names and sizes are those of safetensors.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum DType {
            $( $(#[$doc])* $v, )*
        }

        impl DType {
            /// Every dtype, in code order.
            pub const ALL: &'static [DType] = &[$(DType::$v),*];

            /// Bytes per element.
            pub const fn size(self) -> usize {
                match self { $(DType::$v => $size,)* }
            }

            /// The safetensors name (`"BF16"`, `"F8_E4M3"`, ...).
            pub const fn name(self) -> &'static str {
                match self { $(DType::$v => $name,)* }
            }

            /// True for floating-point types: their sign bit sits at the top of
            /// the element, which the byte-plane codec rotates out of the exponent.
            pub const fn is_float(self) -> bool {
                match self { $(DType::$v => $float,)* }
            }

            /// The one-byte code used in binary manifests. Stable forever.
            pub const fn code(self) -> u8 {
                match self { $(DType::$v => $code,)* }
            }

            /// The dtype with a binary code.
            pub fn from_code(code: u8) -> Result<Self, FormatError> {
                match code {
                    $($code => Ok(DType::$v),)*
                    other => Err(FormatError::malformed("dtype", format!("unknown dtype code {other}"))),
                }
            }
        }

        impl FromStr for DType {
            type Err = FormatError;
            fn from_str(s: &str) -> Result<Self, FormatError> {
                match s {
                    $($name => Ok(DType::$v),)*
                    other => Err(FormatError::invalid("dtype", format!("unknown dtype {other:?}"))),
                }
            }
        }
    };
}

dtypes! {
    /// IEEE 754 binary64.
    F64 = 0, "F64", 8, true;
    /// IEEE 754 binary32.
    F32 = 1, "F32", 4, true;
    /// IEEE 754 binary16.
    F16 = 2, "F16", 2, true;
    /// bfloat16: the top half of a binary32.
    BF16 = 3, "BF16", 2, true;
    /// FP8 with 4 exponent and 3 mantissa bits.
    F8_E4M3 = 4, "F8_E4M3", 1, true;
    /// FP8 with 5 exponent and 2 mantissa bits.
    F8_E5M2 = 5, "F8_E5M2", 1, true;
    /// Signed 64-bit integer.
    I64 = 6, "I64", 8, false;
    /// Signed 32-bit integer.
    I32 = 7, "I32", 4, false;
    /// Signed 16-bit integer.
    I16 = 8, "I16", 2, false;
    /// Signed 8-bit integer.
    I8 = 9, "I8", 1, false;
    /// Unsigned 64-bit integer.
    U64 = 10, "U64", 8, false;
    /// Unsigned 32-bit integer.
    U32 = 11, "U32", 4, false;
    /// Unsigned 16-bit integer.
    U16 = 12, "U16", 2, false;
    /// Unsigned 8-bit integer.
    U8 = 13, "U8", 1, false;
    /// Boolean, one byte per element.
    BOOL = 14, "BOOL", 1, false;
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_codes_and_sizes_round_trip() {
        assert_eq!(DType::ALL.len(), 15);
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(usize::from(d.code()), i);
            assert_eq!(DType::from_code(d.code()), Ok(*d));
            assert_eq!(d.name().parse::<DType>(), Ok(*d));
        }
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F8_E5M2.size(), 1);
        assert_eq!(DType::U64.size(), 8);
        assert!(DType::from_code(15).is_err());
        assert!("bf16".parse::<DType>().is_err());
    }
}
