// Strings cross the boundary as UTF-8 bytes that this file converts explicitly, whatever the platform's
// default marshalling is.
using System;
using System.Runtime.InteropServices;
using System.Text;

namespace PeftC
{
    internal static class Utf8
    {
        private static readonly UTF8Encoding Strict = new UTF8Encoding(false, true);

        /// <summary>NUL-terminated UTF-8 bytes of <paramref name="text"/>; null for null. A NUL inside the text
        /// would silently cut the string short in C, so it is refused.</summary>
        internal static byte[] Encode(string text, string what)
        {
            if (text == null) return null;
            if (text.IndexOf('\0') >= 0)
                throw new ArgumentException(what + " must not contain NUL characters", what);
            return Terminated(Bytes(text, what));
        }

        /// <summary>As Encode, but null is an ArgumentNullException.</summary>
        internal static byte[] Required(string text, string what)
        {
            if (text == null) throw new ArgumentNullException(what);
            return Encode(text, what);
        }

        /// <summary>UTF-8 bytes without a terminator (names given with their length may hold NUL bytes).</summary>
        internal static byte[] Bytes(string text, string what)
        {
            try
            {
                return Strict.GetBytes(text);
            }
            catch (EncoderFallbackException e)
            {
                throw new ArgumentException(what + " is not valid Unicode (a lone surrogate)", what, e);
            }
        }

        internal static byte[] Terminated(byte[] bytes)
        {
            var result = new byte[bytes.Length + 1];
            Buffer.BlockCopy(bytes, 0, result, 0, bytes.Length);
            return result;
        }

        /// <summary>A NUL-terminated UTF-8 string from C, or null for NULL.</summary>
        internal static unsafe string Decode(IntPtr text)
        {
            if (text == IntPtr.Zero) return null;
            byte* p = (byte*)text;
            int length = 0;
            while (p[length] != 0) length++;
            return Encoding.UTF8.GetString(p, length);
        }

        /// <summary>A UTF-8 string of known length from C (it may hold NUL bytes).</summary>
        internal static unsafe string Decode(IntPtr text, UIntPtr length)
        {
            if (text == IntPtr.Zero) return null;
            return Encoding.UTF8.GetString((byte*)text, checked((int)length.ToUInt64()));
        }

        /// <summary>Copies and frees a string the library allocated (char** out-parameters).</summary>
        internal static string TakeOwned(IntPtr text)
        {
            try
            {
                return Decode(text);
            }
            finally
            {
                Native.peft_string_free(text);
            }
        }

        /// <summary>Copies and frees a list of strings the library allocated (peft_string_list** out-parameters).</summary>
        internal static string[] TakeList(IntPtr list)
        {
            try
            {
                var strings = new string[checked((int)Native.peft_string_list_count(list).ToUInt64())];
                for (int i = 0; i < strings.Length; i++)
                    strings[i] = Decode(Native.peft_string_list_get(list, new UIntPtr((uint)i)));
                return strings;
            }
            finally
            {
                Native.peft_string_list_free(list);
            }
        }
    }
}
